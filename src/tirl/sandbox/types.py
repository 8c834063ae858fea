"""What every sandbox backend shares: the record one execution returns, and the batch interface callers use."""

from __future__ import annotations

import dataclasses
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

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
    files: the files the caller asked to fetch that existed after the run (SandboxFusion's `fetch_files`).
    files_skipped: fetch paths that existed but were left out, with why (the run's fetch limit was spent).
    """

    stdout: str
    stderr: str
    exit_code: int | None
    timed_out: bool
    output_truncated: bool
    wall_time: float
    sandbox_error: str | None = None
    memory_exceeded: bool = False
    files: dict[str, str] = dataclasses.field(default_factory=dict)  # fetched files, path -> base64
    files_skipped: dict[str, str] = dataclasses.field(default_factory=dict)  # path -> why it was left out

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


class Sandbox(Protocol):
    """What the agent loop, the solver and the code rewards need: the local pool and the HTTP client both fit."""

    def run_batch(
        self,
        codes: Sequence[str],
        *,
        stdins: Sequence[str | None] | None = None,
        timeout_s: float | None = None,
    ) -> list[ExecResult]: ...


def batch_stdins(codes: Sequence[str], stdins: Sequence[str | None] | None) -> Sequence[str | None]:
    """One stdin (or None) per snippet, checked: a length mismatch would silently pair tests with wrong inputs."""
    if stdins is None:
        return [None] * len(codes)
    if len(stdins) != len(codes):
        raise ValueError(f"run_batch: {len(codes)} snippets but {len(stdins)} stdins")
    return stdins
