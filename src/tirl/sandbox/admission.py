"""Which requests `tirl sandbox serve` runs, and the run itself: at most `workers + queue` in flight, the rest
answered 429 at once (overload never hangs a client), each admitted run on a worker thread, counted in the
metrics, and every run that does not end `ok` logged (logger `tirl.sandbox`, one line: status and reason).

Not here: the HTTP routes (`tirl.sandbox.server`), what a request may ask (`tirl.sandbox.run_request`), the pool
that runs it (`tirl.sandbox.local`).
"""

from __future__ import annotations

import logging
import time

from tirl.sandbox.local import LocalSandbox, SandboxOverloaded
from tirl.sandbox.prometheus import Metrics
from tirl.sandbox.types import ExecResult

log = logging.getLogger("tirl.sandbox")


def failure_reason(r: ExecResult, timeout_s: float) -> str:
    """One line saying why a run did not end ok (for the server's log)."""
    if r.sandbox_error is not None:
        return r.sandbox_error
    if r.status == "timeout":
        return f"killed after {timeout_s:g} s wall clock" if r.timed_out else "CPU time limit (SIGXCPU)"
    if r.status == "output_truncated":
        return "output over the per-stream cap; run killed"
    if r.status == "memory_exceeded" and r.memory_exceeded:
        return "killed by the memory cgroup's OOM killer"
    last = next((line for line in reversed(r.stderr.splitlines()) if line.strip()), "")
    return f"exit code {r.exit_code}: {last[:200]}" if last else f"exit code {r.exit_code}"


class Admission:
    """Admission (429 beyond workers + queue) and the run itself on a worker thread, with metrics and the log line."""

    def __init__(self, sandbox: LocalSandbox, metrics: Metrics, max_queue: int) -> None:
        import anyio

        self.sandbox, self.metrics = sandbox, metrics
        self.capacity = sandbox.workers + max_queue
        self.limiter = anyio.CapacityLimiter(self.capacity)
        self.inflight = 0

    async def run(
        self, code: str, stdin: str | None, timeout: float, memory: int, files: dict, fetch: list[str]
    ) -> ExecResult:
        import anyio
        from fastapi import HTTPException

        if self.inflight >= self.capacity:
            self.metrics.rejected["overloaded"] += 1
            raise HTTPException(
                429, f"overloaded: {self.capacity} runs in flight", headers={"Retry-After": "1"}
            )
        self.inflight += 1
        t0 = time.monotonic()
        try:
            result = await anyio.to_thread.run_sync(
                lambda: self.sandbox.run(
                    code, stdin=stdin, timeout_s=timeout, memory_mb=memory, files=files, fetch_files=fetch
                ),
                limiter=self.limiter,
            )
        except SandboxOverloaded as e:
            self.metrics.rejected["overloaded"] += 1
            raise HTTPException(429, f"overloaded: {e}", headers={"Retry-After": "1"}) from None
        except RuntimeError as e:  # the pool is closed: shutting down
            raise HTTPException(503, f"sandbox unavailable: {e}") from None
        finally:
            self.inflight -= 1
        self.metrics.observe(result.status, time.monotonic() - t0)
        if result.status != "ok":
            reason = failure_reason(result, timeout)
            log.warning("run failed: status=%s reason=%s wall=%.3fs", result.status, reason, result.wall_time)
        return result
