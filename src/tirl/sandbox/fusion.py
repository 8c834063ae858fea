"""SandboxFusion's `/run_code` wire format <-> ExecResult: pure functions shared by tirl's server and client.

SandboxFusion (bytedance/SandboxFusion) answers a RunCodeResponse: `status` Success/Failed/SandboxError,
`message`, `compile_result` (always null for Python), `run_result` (`status` Finished/TimeLimitExceeded/Error,
`execution_time`, `return_code` (null after a timeout), `stdout`, `stderr`), `executor_pod_name` (the server's
MY_POD_NAME, else null) and `files` (fetched files, path -> base64). That format has no place for "output
truncated" or "killed for memory", so tirl's server adds a `tirl` object with its own status; the client uses it
when present and falls back to the SandboxFusion fields for a real SandboxFusion server.
"""

from __future__ import annotations

import os
from typing import Any

from tirl.sandbox.types import ExecResult


def request_body(code: str, *, stdin: str | None, timeout_s: float, memory_mb: int | None = None) -> dict:
    """The body verl and other SandboxFusion clients send for a Python run."""
    return {
        "code": code,
        "language": "python",
        "stdin": stdin,
        "compile_timeout": 10.0,
        "run_timeout": timeout_s,
        "memory_limit_MB": -1 if memory_mb is None else memory_mb,
        "files": {},
        "fetch_files": [],
    }


def to_response(r: ExecResult) -> dict[str, Any]:
    """ExecResult -> SandboxFusion RunCodeResponse (+ the `tirl` extension)."""
    pod = os.environ.get("MY_POD_NAME")
    if r.sandbox_error is not None:  # as SandboxFusion's runner reports its own errors: status Error, no code
        return {
            "status": "SandboxError",
            "message": r.sandbox_error,
            "compile_result": None,
            "run_result": {
                "status": "Error",
                "execution_time": None,
                "return_code": None,
                "stdout": None,
                "stderr": r.sandbox_error,
            },
            "executor_pod_name": pod,
            "files": {},
            "tirl": {
                "status": r.status,
                "output_truncated": False,
                "memory_exceeded": False,
                "timed_out": False,
            },
        }
    run_status = "TimeLimitExceeded" if r.status == "timeout" else "Finished"
    failed = run_status != "Finished" or r.exit_code != 0 or r.output_truncated
    return {
        "status": "Failed" if failed else "Success",
        "message": "",
        "compile_result": None,
        "run_result": {
            "status": run_status,
            "execution_time": r.wall_time,
            "return_code": None if run_status == "TimeLimitExceeded" else r.exit_code,
            "stdout": r.stdout,
            "stderr": r.stderr,
        },
        "executor_pod_name": pod,
        "files": dict(r.files),
        "tirl": {
            "status": r.status,
            "output_truncated": r.output_truncated,
            "memory_exceeded": r.memory_exceeded,
            "timed_out": r.timed_out,
            "files_skipped": dict(r.files_skipped),  # fetch paths left out (the run's fetch limit), and why
        },
    }


def from_response(payload: dict[str, Any], *, wall_time: float) -> ExecResult:
    """SandboxFusion (or tirl) RunCodeResponse -> ExecResult; a malformed answer is a sandbox_error."""
    if not isinstance(payload, dict) or "status" not in payload:
        return ExecResult(
            "", "", None, False, False, wall_time, f"malformed sandbox response: {payload!r:.200}"
        )
    run = payload.get("run_result")
    ext = payload.get("tirl") or {}
    if payload["status"] == "SandboxError" or not isinstance(run, dict):
        msg = payload.get("message") or "SandboxError without a run_result"
        return ExecResult("", "", None, False, False, wall_time, str(msg))
    if not isinstance(ext, dict):
        ext = {}
    timed_out = bool(ext.get("timed_out", run.get("status") == "TimeLimitExceeded"))
    code = run.get("return_code")
    if code is None and run.get("status") == "TimeLimitExceeded":
        # SandboxFusion reports no return code for a killed run; tirl's own says whether the wall clock (SIGKILL)
        # or the CPU-time limit (SIGXCPU) ended it
        code = -9 if timed_out or "timed_out" not in ext else -24
    stdout, stderr, elapsed = run.get("stdout") or "", run.get("stderr") or "", run.get("execution_time")
    wrong = [
        k
        for k, ok in (
            ("stdout", isinstance(stdout, str)),
            ("stderr", isinstance(stderr, str)),
            ("return_code", code is None or (isinstance(code, int) and not isinstance(code, bool))),
            ("execution_time", elapsed is None or isinstance(elapsed, int | float)),
        )
        if not ok
    ]
    if wrong:  # a broken server must not crash the rollout with a TypeError deep in a caller
        return ExecResult("", "", None, False, False, wall_time, f"malformed sandbox response: bad {wrong}")
    files = payload.get("files") or {}
    skipped = ext.get("files_skipped") if isinstance(ext.get("files_skipped"), dict) else {}
    return ExecResult(
        files_skipped={k: v for k, v in skipped.items() if isinstance(v, str)},
        files={k: v for k, v in files.items() if isinstance(v, str)} if isinstance(files, dict) else {},
        stdout=stdout,
        stderr=stderr,
        exit_code=code,
        timed_out=timed_out,
        output_truncated=bool(ext.get("output_truncated", False)),
        wall_time=float(elapsed or wall_time),
        memory_exceeded=bool(ext.get("memory_exceeded", False)),
    )
