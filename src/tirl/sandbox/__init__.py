"""Execution of model-written code: a warm, isolated in-process pool or remote servers (see local.py's docstring)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tirl.sandbox.config import SandboxConfig
from tirl.sandbox.isolation import SandboxUnavailable
from tirl.sandbox.local import LocalSandbox, SandboxOverloaded
from tirl.sandbox.types import ExecResult

if TYPE_CHECKING:
    from tirl.sandbox.client import SandboxClient


def build_sandbox(config: SandboxConfig) -> LocalSandbox | SandboxClient:
    """The sandbox a run's config asks for; every caller (agent loop, solver, code rewards) goes through here."""
    if config.backend == "remote":
        from tirl.sandbox.client import SandboxClient

        return SandboxClient(config)
    return LocalSandbox(config)


__all__ = [
    "ExecResult",
    "LocalSandbox",
    "SandboxConfig",
    "SandboxOverloaded",
    "SandboxUnavailable",
    "build_sandbox",
]
