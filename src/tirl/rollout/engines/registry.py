"""The engines, found by listing this folder: each subpackage `tirl.rollout.engines.<name>` holding a `spec.py` is
the engine `rollout.engine=<name>`, so adding one edits no list of names.

What an engine adds to `rollout.*` is read from its optional `config.py`, a leaf module that imports no other part
of `tirl.rollout` (its `spec.py` knows `RolloutConfig`; `tirl.rollout.config` reads this module, so it must not):
- `SECTION`: the dataclass of the keys only this engine reads, `rollout.<name>.*` (`TorchEngineConfig`);
- `REQUIRED_KEYS`: keys of `rollout.*` this engine needs set (the openai engine: `urls`, `model_name`).

Deliberately not here: building, sizing or checking an engine; `tirl.rollout.factory` asks its `SPEC`.
"""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path
from types import ModuleType

from tirl.rollout import engines as _package


def _find(paths: list[str]) -> dict[str, set[str]]:
    """name -> the module names inside it, for each subpackage of `paths` that holds a spec module."""
    found = {}
    for info in pkgutil.iter_modules(paths):
        folder = getattr(info.module_finder, "path", None)
        if info.ispkg and folder is not None:
            inside = {m.name for m in pkgutil.iter_modules([str(Path(folder, info.name))])}
            if "spec" in inside:
                found[info.name] = inside
    return found


def _configs(found: dict[str, set[str]]) -> dict[str, ModuleType]:
    return {
        name: importlib.import_module(f"{_package.__name__}.{name}.config")
        for name, inside in sorted(found.items())
        if "config" in inside
    }


_FOUND = _find(list(_package.__path__))
_CONFIGS = _configs(_FOUND)

# rollout.engine's values, in name order
ENGINES: tuple[str, ...] = tuple(sorted(_FOUND))
# engine -> the dataclass of rollout.<engine>.*, for the engines with keys of their own
SECTIONS: dict[str, type] = {n: m.SECTION for n, m in _CONFIGS.items() if hasattr(m, "SECTION")}
# engine -> the keys of rollout.* it needs set
REQUIRED_KEYS: dict[str, tuple[str, ...]] = {
    n: tuple(m.REQUIRED_KEYS) for n, m in _CONFIGS.items() if hasattr(m, "REQUIRED_KEYS")
}
