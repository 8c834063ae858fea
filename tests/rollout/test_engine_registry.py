"""An engine is one folder: `tirl.rollout.engines.registry` finds each package with a `spec.py`, and `rollout.*`
takes the engine's name and its section (`config.py`) with no list of engines anywhere else."""

from __future__ import annotations

import ast
import importlib
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import pytest

import tirl.rollout.config as rollout_config
import tirl.rollout.factory  # noqa: F401  (loaded, so the fixture can re-import it afresh)
from tirl.core.config import ConfigError, load_config, to_dict
from tirl.rollout import engines
from tirl.rollout.engines import registry
from tirl.rollout.engines.torch.config import TorchEngineConfig
from tirl.rollout.engines.vllm.config import VllmConfig

FAKE = {
    "__init__.py": "",
    "spec.py": """
        from tirl.rollout.engines.spec import EngineMemory, EngineSpec

        SPEC = EngineSpec("fake", "tirl.rollout.engines.fake.engine:FakeEngine", lambda ro, x: None,
                          lambda q: EngineMemory(0.0, "nowhere", True))
    """,
    "config.py": """
        from dataclasses import dataclass

        @dataclass
        class FakeConfig:
            knob: int = 1

        SECTION = FakeConfig
        REQUIRED_KEYS = ("model_name",)
    """,
}


@pytest.fixture
def fresh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """`tirl.rollout.factory` (and the config and registry it imports) imported afresh with one more folder on the
    engines' path holding a package `fake`: a new engine, with no file under src/ edited. Undone afterwards."""
    for name, text in FAKE.items():
        (tmp_path / "fake").mkdir(exist_ok=True)
        (tmp_path / "fake" / name).write_text(textwrap.dedent(text))
    monkeypatch.setattr(engines, "__path__", [*engines.__path__, str(tmp_path)])
    for name in ("tirl.rollout.engines.registry", "tirl.rollout.config", "tirl.rollout.factory"):
        parent, _, attr = name.rpartition(".")
        monkeypatch.setattr(sys.modules[parent], attr, getattr(sys.modules[parent], attr))
        monkeypatch.delitem(sys.modules, name)
    yield importlib.import_module("tirl.rollout.factory")
    for name in [n for n in sys.modules if n.startswith("tirl.rollout.engines.fake")]:
        del sys.modules[name]


def test_the_registry_finds_every_engine_folder():
    assert registry.ENGINES == ("openai", "torch", "vllm")
    assert registry.SECTIONS == {"torch": TorchEngineConfig, "vllm": VllmConfig}
    assert registry.REQUIRED_KEYS == {"openai": ("urls", "model_name")}
    assert rollout_config.ENGINES is registry.ENGINES


def test_the_rollout_config_names_no_engine():
    """It imports no engine module (only the registry that finds them) and spells no engine's name but the default
    of `rollout.engine`."""
    tree = ast.parse(Path(rollout_config.__file__).read_text())
    imported = {
        node.module if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    assert {m for m in imported if m.startswith("tirl.rollout.engines")} == {"tirl.rollout.engines.registry"}
    strings = {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant)}
    assert strings & set(registry.ENGINES) == {rollout_config.RolloutConfig.engine} == {"torch"}


def test_an_engine_folder_of_its_own_is_a_rollout_engine_with_its_section(fresh: ModuleType):
    rollout = sys.modules["tirl.rollout.config"]
    assert rollout.ENGINES == ("fake", "openai", "torch", "vllm")
    cfg = load_config(rollout.RolloutConfig, None, ["engine=fake", "model_name=m", "fake.knob=3"])
    assert (cfg.engine, cfg.fake.knob, cfg.torch, cfg.vllm) == ("fake", 3, TorchEngineConfig(), VllmConfig())
    assert list(to_dict(cfg))[-3:] == ["fake", "torch", "vllm"]
    assert fresh.engine_spec("fake").name == "fake"
    with pytest.raises(
        ValueError, match=r"unknown rollout.engine 'sglang'; valid: fake, openai, torch, vllm$"
    ):
        fresh.engine_spec("sglang")


def test_an_engine_folder_of_its_own_checks_the_keys_it_needs(fresh: ModuleType):
    rollout = sys.modules["tirl.rollout.config"]
    with pytest.raises(ConfigError, match=r"^RolloutConfig: rollout.engine=fake needs rollout.model_name$"):
        load_config(rollout.RolloutConfig, None, ["engine=fake"])
