"""Execution of model-written code. `LocalSandbox` is process-level isolation only: see its docstring."""

from tirl.sandbox.local import LocalSandbox, SandboxConfig
from tirl.sandbox.types import ExecResult


def build_sandbox(config: SandboxConfig) -> LocalSandbox:
    """The sandbox a run's config asks for; every caller (agent loop, solver, code rewards) goes through here."""
    return LocalSandbox(config)


__all__ = ["ExecResult", "LocalSandbox", "SandboxConfig", "build_sandbox"]
