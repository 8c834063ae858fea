"""What every SFT trajectory writer needs: a code_interpreter call as the SFT schema stores it, and many snippets
through the sandbox with a progress bar (the demo's scripted solver, GSM8K's stitched trajectories)."""

from __future__ import annotations

from typing import Any

from tirl.core.progress import progress
from tirl.sandbox.types import Sandbox
from tirl.tools.code_interpreter import TOOL_NAME


def code_call(code: str) -> dict[str, Any]:
    """An assistant message's code_interpreter call, as the SFT schema stores it."""
    return {"type": "function", "function": {"name": TOOL_NAME, "arguments": {"code": code}}}


def run_with_progress(
    sandbox: Sandbox, codes: list[str], chunk: int = 256, *, label: str = "solver tool calls"
) -> list[Any]:
    """Every snippet through the sandbox in batches, with a progress bar."""
    results: list[Any] = []
    with progress(label, len(codes)) as bar:
        for s in range(0, len(codes), chunk):
            results += sandbox.run_batch(codes[s : s + chunk])
            bar.advance(len(codes[s : s + chunk]))
    return results
