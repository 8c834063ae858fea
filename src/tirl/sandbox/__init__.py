"""Execution of model-written code. `LocalSandbox` is process-level isolation only: see its docstring."""

from tirl.sandbox.local import LocalSandbox, SandboxConfig
from tirl.sandbox.types import ExecResult

__all__ = ["ExecResult", "LocalSandbox", "SandboxConfig"]
