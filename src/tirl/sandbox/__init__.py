"""Execution of model-written code: a warm, isolated in-process pool or remote servers (see local.py's docstring)."""

from __future__ import annotations

from tirl.sandbox.client import SandboxClient
from tirl.sandbox.config import SandboxConfig
from tirl.sandbox.isolation import SandboxUnavailable
from tirl.sandbox.local import LocalSandbox, SandboxOverloaded
from tirl.sandbox.types import ExecResult


def build_sandbox(config: SandboxConfig) -> LocalSandbox | SandboxClient:
    """The sandbox a run's config asks for; every caller (agent loop, solver, code rewards) goes through here."""
    if config.backend == "remote":
        return SandboxClient(config)
    return LocalSandbox(config)


__all__ = [
    "ExecResult",
    "LocalSandbox",
    "SandboxClient",
    "SandboxConfig",
    "SandboxOverloaded",
    "SandboxUnavailable",
    "build_sandbox",
]
