"""Is the sandbox itself working? A start-up probe, and the rule that stops a run whose sandbox went down.

A broken sandbox must not look like a bad model: without these checks every tool reply reads "the sandbox
failed", the model scores 0 and RL trains on it. Only infrastructure failures count (status `sandbox_error`: a
refused connection, a dead worker, an HTTP error); the snippet's own exceptions and timeouts are the model's
business and never stop a run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from tirl.core.errors import TirlError
from tirl.sandbox import build_sandbox
from tirl.sandbox.config import SandboxConfig

PROBE = "print(6 * 7)"


class SandboxBroken(TirlError):
    """The sandbox (not the model's code) fails: a start-up probe did, or every sandbox call of a step did."""


def _fix(config: SandboxConfig) -> str:
    if config.backend == "remote":
        return (
            "check that `tirl sandbox serve` (or SandboxFusion) runs there and answers GET /health, that "
            "sandbox.auth_token_file or $TIRL_SANDBOX_TOKEN holds its token, or use sandbox.backend=local"
        )
    return "run `tirl sandbox serve` in the foreground to see the worker's error, or check sandbox.python"


def _probe(config: SandboxConfig) -> str | None:
    """None when PROBE prints 42 through a sandbox built from `config`, else what went wrong."""
    with build_sandbox(config) as sandbox:
        r = sandbox.run_batch([PROBE])[0]
    if r.status == "ok" and r.stdout == "42\n":
        return None
    if r.sandbox_error is not None:
        return r.sandbox_error
    tail = r.stderr.strip().splitlines()[-1:] or [repr(r.stdout[:100])]
    return f"`{PROBE}` ended {r.status} (exit code {r.exit_code}): {tail[0][:300]}"


def check_sandbox(config: SandboxConfig) -> None:
    """Run PROBE on the configured sandbox (each remote URL on its own) before a model is loaded.

    Raises SandboxBroken naming the backend or URL, what failed and what to do.
    """
    targets = (
        [("sandbox.urls", dataclasses.replace(config, urls=(u,))) for u in config.urls]
        if config.backend == "remote"
        else [(f"sandbox (local, isolation {config.isolation})", config)]
    )
    for name, cfg in targets:
        error = _probe(cfg)
        if error is not None:
            where = f"{name} {cfg.urls[0]}" if config.backend == "remote" else name
            raise SandboxBroken(f"start-up check of the {where} failed: {error}; {_fix(config)}")


def raise_if_sandbox_down(results: Iterable[Mapping[str, Any]], where: str) -> None:
    """Stop when every sandbox call in `results` (ExecResult.to_dict() of one step's calls) failed in the sandbox.

    A step with no sandbox call, or with one call that reached the sandbox, passes.
    """
    results = list(results)
    if not results or any(r.get("status") != "sandbox_error" for r in results):
        return
    first = str(results[0].get("sandbox_error") or "")[:300]
    raise SandboxBroken(
        f"{where}: all {len(results)} sandbox calls failed in the sandbox itself, not in the model's code "
        f"(first: {first}); the run stops rather than learn from or score a broken sandbox. Fix the sandbox and "
        "run again (`tirl rl --resume auto` continues from the last checkpoint)"
    )
