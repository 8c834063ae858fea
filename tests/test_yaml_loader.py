"""tirl's one YAML reader (`tirl.core.yamlread`): what it refuses, in one line naming the file, and that every YAML
tirl reads goes through it."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tirl.commands.run_config import TirlConfig
from tirl.core.config import ConfigError, load_config
from tirl.core.yamlread import load_yaml, read_yaml_file

SRC = Path(__file__).resolve().parents[1] / "src" / "tirl"
# a YAML read that is not the one loader: safe_load / load / full_load / unsafe_load / load_all on the yaml module
_PLAIN_READ = re.compile(r"\byaml\.(safe_load|load|full_load|unsafe_load|load_all|safe_load_all)\s*\(")


def _plain_yaml_reads(root: Path) -> list[str]:
    """`file:line` of every YAML read under `root` that bypasses `tirl.core.yamlread`."""
    found = []
    for path in sorted(root.rglob("*.py")):
        if path.name == "yamlread.py" and path.parent.name == "core":
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if _PLAIN_READ.search(line):
                found.append(f"{path.relative_to(root)}:{n}")
    return found


@dataclass
class Inner:
    lr: float = 1e-3


@dataclass
class Outer:
    seed: int = 0
    optim: Inner = field(default_factory=Inner)


def write(tmp_path: Path, text: str, name: str = "cfg.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_the_plain_read_checker_finds_a_planted_safe_load(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "ok.py").write_text("import yaml\ntext = yaml.safe_dump({})\n")
    (pkg / "bad.py").write_text("import yaml\n\n\ndata = yaml.safe_load(open('x'))\n")
    assert _plain_yaml_reads(pkg) == ["bad.py:4"]


def test_every_yaml_read_in_tirl_goes_through_the_one_loader() -> None:
    assert _plain_yaml_reads(SRC) == []


def test_a_top_level_key_given_twice_is_refused_naming_the_key_and_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "seed: 1\noptim:\n  lr: 0.1\nseed: 2\n")
    said = f"config file {path}: the key 'seed' is given twice in one mapping (lines 1 and 4): keep one"
    with pytest.raises(ConfigError, match=re.escape(said)):
        load_config(Outer, path)


def test_a_nested_key_given_twice_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "optim:\n  lr: 0.1\n  lr: 0.2\n")
    with pytest.raises(
        ConfigError, match=re.escape("the key 'lr' is given twice in one mapping (lines 2 and 3)")
    ):
        load_config(Outer, path)


def test_a_duplicate_key_in_a_real_config_section_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "rl:\n  optim:\n    lr: 1.0e-3\n  steps: 5\n  optim:\n    lr: 1.0e-5\n")
    with pytest.raises(ConfigError, match="the key 'optim' is given twice"):
        load_config(TirlConfig, path)


def test_a_merge_key_may_still_be_overridden(tmp_path: Path) -> None:
    text = "base: &b {x: 1, y: 2}\nmine:\n  <<: *b\n  x: 5\n"
    assert load_yaml(text)["mine"] == {"x": 5, "y": 2}


def test_a_document_nested_past_the_recursion_limit_is_one_line() -> None:
    with pytest.raises(ConfigError, match="nested too deeply to read"):
        load_yaml("[" * 5000 + "]" * 5000)


def test_a_config_that_is_not_yaml_is_one_line_naming_file_line_and_column(tmp_path: Path) -> None:
    path = write(tmp_path, "seed: [1\n")
    with pytest.raises(ConfigError) as exc:
        load_config(Outer, path)
    msg = str(exc.value)
    assert "\n" not in msg
    assert msg.startswith(f"config file {path} is not valid YAML: ") and "line 2, column 1" in msg


def test_a_missing_file_names_what_it_is_for(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=re.escape(f"--arms not found: {tmp_path / 'nope.yaml'}")):
        read_yaml_file(tmp_path / "nope.yaml", "--arms")
