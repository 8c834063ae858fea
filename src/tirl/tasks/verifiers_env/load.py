"""Load a verifiers environment by its id, as verifiers itself does, with errors that name what went wrong.

`verifiers` (PyPI; its API is `verifiers.v1`) is imported here and only when a `verifiers:ENV` task is loaded, so
tirl never needs it otherwise. ENV is what `vf-eval ENV` takes: verifiers strips a Hub owner and version
(`owner/name@1.0` is `name`), turns dashes into underscores and imports the module of that name, a built-in
taskset of `verifiers.v1.tasksets` first; the module exports its `Taskset` subclass in `__all__`
(`verifiers.v1.utils.loaders`). The taskset is built from its config class at the defaults: verifiers'
`--env.taskset.*` knobs have no `task.*` counterpart here.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import Any

INSTALL = "pip install 'tirl[verifiers]'"


def require_verifiers() -> ModuleType:
    """`verifiers.v1`, or a ValueError saying how to get it."""
    for name, missing in (
        ("verifiers", "the verifiers package"),
        ("verifiers.v1", "verifiers >= 0.4 (its v1 API)"),
    ):
        try:
            module = importlib.import_module(name)
        except ImportError as e:
            if getattr(e, "name", None) == name:
                raise ValueError(f"task=verifiers:ENV needs {missing}: {INSTALL}") from None
            raise ValueError(f"verifiers is installed but does not import: {e}") from None
    return module


@dataclass(frozen=True)
class LoadedEnv:
    """A verifiers environment: its id and its taskset."""

    env_id: str
    vf: ModuleType  # verifiers.v1
    taskset: Any  # a vf.Taskset, at its config's defaults

    @property
    def spec(self) -> str:
        return f"verifiers:{self.env_id}"

    def first_task(self) -> Any:
        """The taskset's first task (what the checks of its hooks and tools look at)."""
        task = next(iter(self.taskset.take(1)), None)
        if task is None:
            raise ValueError(f"task {self.spec!r}: the environment's taskset yields no tasks")
        return task


def load_env(env_id: str) -> LoadedEnv:
    """The environment `env_id` names; a ValueError naming it when verifiers cannot load it."""
    vf = require_verifiers()
    spec = f"verifiers:{env_id}"
    if not env_id.strip():
        raise ValueError(
            "task 'verifiers:' names no environment: task=verifiers:ENV, ENV an installed verifiers "
            "environment's id or module (as vf-eval takes it)"
        )
    try:
        config = vf.taskset_config_type(env_id).model_validate({"id": env_id})
        taskset = vf.load_taskset(config)
    except (ImportError, AttributeError, TypeError, ValueError) as e:
        cause = (
            f" (because: {e.__cause__})" if e.__cause__ is not None and str(e.__cause__) not in str(e) else ""
        )
        raise ValueError(
            f"task {spec!r}: verifiers cannot load environment {env_id!r}: {e}{cause}. ENV is the id or "
            "module name of an installed environment (a module or package on sys.path exporting its "
            "vf.Taskset subclass in __all__; not a dotted path)"
        ) from None
    return LoadedEnv(env_id, vf, taskset)
