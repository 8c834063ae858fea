"""What a `POST /run_code` request may ask of `tirl sandbox serve`, and what it gets: SandboxFusion's request
model (Python's fields), the checks that answer 400 naming what is wrong, and the limits it runs under.

Limits are a default and a ceiling: a request without `run_timeout` / `memory_limit_MB` gets `sandbox.timeout_s` /
`sandbox.memory_mb`; one that asks gets what it asks for, up to `sandbox.max_timeout_s` / `sandbox.max_memory_mb`
(a larger value is clamped, not refused, as SandboxFusion clients send fixed values). pydantic and FastAPI are
imported only when the server starts.
"""

# No `from __future__ import annotations`: pydantic reads the request model's annotations as written.

from typing import Any

from tirl.sandbox.config import SandboxConfig
from tirl.sandbox.local import file_request
from tirl.sandbox.prometheus import Metrics


def request_model() -> type:
    """SandboxFusion's RunCodeRequest (Python's fields), built when the server starts (pydantic is imported lazily)."""
    from pydantic import BaseModel, ConfigDict, Field

    class RunCodeRequest(BaseModel):
        model_config = ConfigDict(extra="ignore")
        code: str
        language: str = "python"
        compile_timeout: float = 10.0  # accepted and unused: Python has no compile step (as in SandboxFusion)
        # None: sandbox.timeout_s; <= max_timeout_s. NaN and inf are refused (Python's JSON reads them)
        run_timeout: float | None = Field(default=None, gt=0, allow_inf_nan=False)
        memory_limit_MB: int = -1  # <= 0: sandbox.memory_mb (SandboxFusion: no limit); <= max_memory_mb
        stdin: str | None = None
        files: dict[str, str | None] = Field(default_factory=dict)
        fetch_files: list[str] = Field(default_factory=list)

    return RunCodeRequest


def checked_request(req: Any, metrics: Metrics) -> dict[str, str | None]:
    """The request's `files` to write (SandboxFusion skips those named IGNORE_THIS_FILE), or HTTP 400 naming
    what is wrong: a language other than Python, or a bad `files`/`fetch_files` path or content."""
    from fastapi import HTTPException

    if req.language.lower() not in ("python", "python3"):
        metrics.rejected["bad_request"] += 1
        raise HTTPException(
            400, f"language {req.language!r} is not supported by tirl's sandbox: only 'python'"
        )
    files = {k: v for k, v in req.files.items() if "IGNORE_THIS_FILE" not in k}  # SandboxFusion skips these
    try:
        file_request(files, req.fetch_files)
    except ValueError as e:
        metrics.rejected["bad_request"] += 1
        raise HTTPException(400, str(e)) from None
    return files


def limits_for(timeout_s: float | None, memory_mb: int, config: SandboxConfig) -> dict[str, Any]:
    """The limits one request runs under: what it asks for up to the ceilings (`max_*`), else the defaults.

    SandboxFusion reads `memory_limit_MB` <= 0 as "no limit"; here that is the server's default. `clamped` names
    the fields a request asked above the ceiling for.
    """
    timeout = config.timeout_s if timeout_s is None else min(timeout_s, config.max_timeout_s)
    memory = config.memory_mb if memory_mb <= 0 else min(memory_mb, config.max_memory_mb)
    clamped = [
        k
        for k, asked, got in (("run_timeout", timeout_s, timeout), ("memory_limit_MB", memory_mb, memory))
        if asked is not None and asked > 0 and asked != got
    ]
    return {"run_timeout": timeout, "memory_limit_MB": memory, "clamped": clamped}
