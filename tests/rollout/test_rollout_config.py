"""`rollout.*` by engine: the keys only one engine reads live in its section (`rollout.torch.*`, `rollout.vllm.*`),
the old flat names are refused with their new ones, and the config knows nothing of the factory that builds from it."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

import tirl.rollout.config as rollout_config
from tirl.commands.run_config import TirlConfig
from tirl.core.config import ConfigError, load_config
from tirl.rollout.config import RolloutConfig
from tirl.rollout.engines.torch.config import TorchEngineConfig
from tirl.rollout.engines.vllm.config import VllmConfig

MOVED = sorted(RolloutConfig.MOVED_KEYS.items())


def _leaf_keys(obj: object, prefix: str = "") -> set[str]:
    out = set()
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        out |= (
            _leaf_keys(value, f"{prefix}{f.name}.") if dataclasses.is_dataclass(value) else {prefix + f.name}
        )
    return out


def test_every_moved_key_names_a_key_that_exists():
    keys = _leaf_keys(TirlConfig())
    assert len(MOVED) == 13
    assert [new for _, new in MOVED if new not in keys] == []
    assert [old for old, _ in MOVED if f"rollout.{old}" in keys] == []


@pytest.mark.parametrize(("old", "new"), MOVED)
def test_an_old_flat_key_in_a_file_names_its_new_key(tmp_path: Path, old: str, new: str):
    path = tmp_path / "old.yaml"
    path.write_text(f"rollout:\n  engine: vllm\n  {old}: 1\n")
    with pytest.raises(
        ConfigError,
        match=rf"^config key 'rollout\.{old}' is now '{new}' \(`tirl config migrate FILE` rewrites a config file\)$",
    ):
        load_config(TirlConfig, path)


@pytest.mark.parametrize(("old", "new"), MOVED)
def test_an_old_flat_key_in_an_override_names_its_new_key(old: str, new: str):
    with pytest.raises(ConfigError, match=rf"config key 'rollout\.{old}' in override .* is now '{new}'"):
        load_config(TirlConfig, None, [f"rollout.{old}=1"])


def test_the_engine_sections_load_from_a_file_and_overrides(tmp_path: Path):
    path = tmp_path / "new.yaml"
    path.write_text(
        "rollout:\n  engine: vllm\n  vllm:\n    args: [--max-model-len=1024]\n    kv_cache_gib: 0.5\n"
        "  torch: {max_batch_size: 8}\n"
    )
    cfg = load_config(TirlConfig, path, ["rollout.vllm.sync=disk", "rollout.torch.pack=off"])
    assert cfg.rollout.vllm == VllmConfig(args=["--max-model-len=1024"], kv_cache_gib=0.5, sync="disk")
    assert cfg.rollout.torch == TorchEngineConfig(max_batch_size=8, pack="off")


@pytest.mark.parametrize(
    ("override", "said"),
    [
        ("rollout.vllm.port=70000", "rollout.vllm: rollout.vllm.kv_cache_gib must be >= 0"),
        ("rollout.vllm.placement=elsewhere", "unknown rollout.vllm.placement 'elsewhere'"),
        ("rollout.vllm.sync=tape", "unknown rollout.vllm.sync 'tape'"),
        ("rollout.torch.pack=always", "rollout.torch: rollout.torch.pack must be one of"),
        ("rollout.torch.keep_prefix_mib=-1", "rollout.torch.keep_prefix_mib must be >= 0"),
    ],
)
def test_an_engine_section_checks_its_own_values(override: str, said: str):
    with pytest.raises(ConfigError, match=said):
        load_config(TirlConfig, None, [override])


def test_the_config_does_not_import_the_factory():
    """One way only: the factory builds engines from `RolloutConfig`; the config names the engines itself."""
    tree = ast.parse(Path(rollout_config.__file__).read_text())
    imported = {
        node.module if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    assert "tirl.rollout.factory" not in imported
    assert rollout_config.ENGINES == ("openai", "torch", "vllm")
