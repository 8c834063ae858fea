"""`tirl compare --arms FILE` and the arms' names: read by tirl's one YAML reader (alias bounds, duplicate keys),
every name checked before any work, every error one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import tirl.demo.ablation.report as report
from tirl.cli import main
from tirl.core.config import ConfigError
from tirl.demo.ablation.arms import MAX_NAME_CHARS, Study, parse_arm, read_arms_file

SRC = Path(__file__).resolve().parents[1] / "src"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "arms.yaml"
    path.write_text(text, encoding="utf-8")
    return path


# the load runs in a child capped at 1 GiB of address space, with 60 s allowed (~0.1 s measured); read with plain
# yaml.safe_load, the baseline's str() expanded the same ~500 bytes until the cap (a MemoryError traceback)
_BOMB_CHILD = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
from tirl.core.config import ConfigError
from tirl.demo.ablation.arms import read_arms_file

try:
    read_arms_file(sys.argv[1])
except ConfigError as e:
    print(e)
"""


def test_an_alias_bomb_in_the_arms_file_is_refused_in_bounded_time_and_memory(tmp_path: Path) -> None:
    levels = ["&l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    levels += [f"&l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 9)]  # 9**9 strings expanded
    path = write(tmp_path, f"arms: {{a: {{}}}}\nbaseline: [{', '.join(levels)}]\n")  # str() of it expanded
    done = subprocess.run(
        [sys.executable, "-c", _BOMB_CHILD, str(path)], capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": str(SRC)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"--arms {path}: its aliases expand to more than 100000 values" in done.stdout
    assert len(done.stdout) < 1000


def test_an_alias_inside_its_own_value_is_a_one_line_error(tmp_path: Path) -> None:
    path = write(tmp_path, "arms:\n  a: &x {rl: *x}\n")
    with pytest.raises(ConfigError) as exc:
        read_arms_file(path)
    assert str(exc.value).startswith(f"--arms {path}: the value &x at line 2 contains its own alias *x")
    assert "\n" not in str(exc.value)


def test_two_arms_of_one_name_in_the_file_are_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "arms:\n  lr: {rl.optim.lr: 1.0e-5}\n  lr: {rl.optim.lr: 1.0e-4}\n")
    with pytest.raises(ConfigError, match="the key 'lr' is given twice in one mapping \\(lines 2 and 3\\)"):
        read_arms_file(path)


@pytest.mark.parametrize("written", ["null", "~", "yes", "2024"])
def test_an_arm_name_that_yaml_reads_as_a_value_is_refused(tmp_path: Path, written: str) -> None:
    path = write(tmp_path, f"arms:\n  base: {{}}\n  {written}: {{rl.n: 4}}\n")
    with pytest.raises(ConfigError, match="an arm name is read by YAML as .*, not text: quote it"):
        read_arms_file(path)


def test_a_quoted_null_is_an_arm_named_null(tmp_path: Path) -> None:
    arms, _ = read_arms_file(write(tmp_path, 'arms:\n  "null": {rl.n: 4}\n'))
    assert [a.name for a in arms] == ["null"]


@pytest.mark.parametrize("name", ["a/b", "../up", "x" * (MAX_NAME_CHARS + 1)])
def test_an_arm_name_that_cannot_name_its_directories_is_refused(name: str) -> None:
    with pytest.raises(ConfigError, match="arm name"):
        parse_arm(f"{name}:rl.n=4")


def test_the_longest_arm_name_fits_a_staged_directory_name() -> None:
    staged = f".eval-{'x' * MAX_NAME_CHARS}.tirl-abcdef-4194303.abcdefgh.tmp"
    assert len(staged.encode()) <= 255


def test_a_300_character_arm_name_is_refused_before_any_work(tmp_path: Path, monkeypatch, capsys) -> None:
    def never(*args, **kwargs):
        raise AssertionError("the comparison ran")

    monkeypatch.setattr(report, "run_comparison", never)
    path = write(tmp_path, f"arms:\n  base: {{}}\n  {'a' * 300}: {{rl.n: 4}}\n")
    out = tmp_path / "out"
    assert main(["compare", "--arms", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "has 300 characters: at most 100" in err and "\n" not in err.strip()
    assert not out.exists()


def test_seeds_past_the_bound_are_refused() -> None:
    arms = (parse_arm("a"), parse_arm("b"))
    with pytest.raises(ConfigError, match="--seeds must be 1-1000, got 1000000"):
        Study("s", arms, seeds=1_000_000)
