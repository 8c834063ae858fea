"""The record one sandboxed execution returns; the rollout turns it into the tool message the model sees."""

from __future__ import annotations

import dataclasses
import signal
from dataclasses import dataclass
from typing import Any, Literal

Status = Literal["ok", "runtime_error", "timeout", "memory_exceeded", "output_truncated", "sandbox_error"]


@dataclass(frozen=True)
class ExecResult:
    """Outcome of running one snippet.

    stdout, stderr: decoded as UTF-8 (undecodable bytes replaced), each cut at the sandbox's byte cap.
    exit_code: the process's return code, negative for a signal (-9 after a kill); None if it never started.
    timed_out: the wall-clock limit was hit and the process group was killed.
    output_truncated: a stream exceeded its cap and the process group was killed.
    wall_time: seconds from start to reaping, including process start-up.
    sandbox_error: the sandbox itself failed (could not start the interpreter); not the snippet's fault.
    memory_exceeded: the run was killed for memory (the cgroup's OOM killer), not only a MemoryError.
    """

    stdout: str
    stderr: str
    exit_code: int | None
    timed_out: bool
    output_truncated: bool
    wall_time: float
    sandbox_error: str | None = None
    memory_exceeded: bool = False

    @property
    def status(self) -> Status:
        """One label per result, most specific first; memory: an OOM kill, or an uncaught MemoryError."""
        if self.sandbox_error is not None:
            return "sandbox_error"
        # RLIMIT_CPU ends a process with SIGXCPU: a CPU-time timeout rather than a crash.
        if self.timed_out or self.exit_code == -signal.SIGXCPU:
            return "timeout"
        if self.output_truncated:
            return "output_truncated"
        if self.memory_exceeded:
            return "memory_exceeded"
        if self.exit_code != 0:
            return "memory_exceeded" if "MemoryError" in self.stderr else "runtime_error"
        return "ok"

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "status": self.status}
