"""Graceful stops: SIGTERM (a scheduler's preemption) or SIGINT (Ctrl-C) ask the trainer to finish its current
step, write a checkpoint and exit; a second SIGINT interrupts at once, as usual."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

EXIT_RESUMABLE = 75  # EX_TEMPFAIL: stopped on request with a checkpoint written; run again with --resume auto


class StopRequested(Exception):
    """Raised by a trainer after it saved a checkpoint because a stop was requested."""

    def __init__(self, checkpoint: str, step: int) -> None:
        super().__init__(
            f"stopped on request after step {step}; checkpoint {checkpoint}. "
            "Run the same command with --resume auto (or --resume DIR) to continue"
        )
        self.checkpoint, self.step = checkpoint, step


class StopFlag:
    def __init__(self) -> None:
        self.requested = False
        self.signal_name = ""


@contextmanager
def graceful_stop() -> Iterator[StopFlag]:
    """Within the block, SIGTERM and a first SIGINT set the flag instead of killing the process."""
    flag = StopFlag()
    if threading.current_thread() is not threading.main_thread():  # handlers can only be set there
        yield flag
        return

    def handler(signum, frame):
        if flag.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        flag.requested, flag.signal_name = True, signal.Signals(signum).name

    old = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield flag
    finally:
        for s, h in old.items():
            signal.signal(s, h)
