"""Each section of the run config is a dataclass of its package's config module (`eval/config.py`,
`train/config.py`, ...), which the run config imports: a reader finds `eval.*` in `tirl.eval.config`, not inside
the evaluator, and the config modules of `eval.*`, `agent.*`, `reward.*` and `sft.*`/`optim.*`/`dist.*` load
without torch. The implementation modules that used to define a section still name it (user code, pickles)."""

from __future__ import annotations

import dataclasses
import importlib
import subprocess
import sys
import typing

import pytest

from tirl.commands.run_config import TirlConfig

# sections defined outside a config module on purpose: a task's own options (`task.*`, chosen by the task) and the
# estimator's and loss's options (`rl.advantage.*`, `rl.loss.*`, registered with the algorithm in tirl.algorithms)
OWN_MODULES = ("tirl.tasks.task", "tirl.algorithms")

# where a section lived before its package had a config module -> the name it keeps there
OLD_NAMES = {
    "tirl.eval.evaluate": "EvalConfig",
    "tirl.models.loading": "ModelConfig",
    "tirl.models.lora": "LoraConfig",
    "tirl.rewards.shaping": "RewardConfig",
    "tirl.rollout.agent.loop": "AgentConfig",
    "tirl.sandbox.local": "SandboxConfig",
    "tirl.train.dist": "DistConfig",
    "tirl.train.optim": "OptimConfig",
    "tirl.train.rl.trainer": "RLConfig",
    "tirl.train.sft": "SFTConfig",
}


def sections(cls: type, key: str = "") -> list[tuple[str, type]]:
    """(dotted key, dataclass) of every section under `cls`, depth first."""
    out = []
    for f in dataclasses.fields(cls):
        t = typing.get_type_hints(cls)[f.name]
        if dataclasses.is_dataclass(t):
            out += [(key + f.name, t), *sections(t, f"{key}{f.name}.")]
    return out


def test_every_section_is_defined_in_a_config_module() -> None:
    found = sections(TirlConfig)
    assert len(found) > 15
    bad = [
        f"{key}: {c.__module__}.{c.__qualname__}"
        for key, c in found
        if c.__module__.rsplit(".", 1)[-1] not in ("config", "run_config")
        and not c.__module__.startswith(OWN_MODULES)
    ]
    assert not bad, "sections defined in an implementation module:\n" + "\n".join(bad)


@pytest.mark.parametrize("module", sorted(OLD_NAMES))
def test_the_old_module_still_names_its_section(module: str) -> None:
    name = OLD_NAMES[module]
    cls = getattr(importlib.import_module(module), name)  # what unpickling an old object looks up
    assert cls.__name__ == name and cls.__module__.endswith("config")


def test_config_modules_load_without_torch() -> None:
    modules = ["tirl.eval.config", "tirl.rollout.agent.config", "tirl.rewards.config", "tirl.train.config"]
    code = f"import sys\nfor m in {modules!r}: __import__(m)\nprint('torch' in sys.modules)"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert done.stdout.strip() == "False"
