"""bench/ stays a small package: every benchmark in the registry, helpers shared through bench/common.py, nothing
taken from tests/ or from tirl's private names, every result file the docs cite present, and the suite run only when
asked for. Nothing is run."""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
NOT_BENCHMARKS = {
    "__init__",
    "__main__",
    "common",
    "registry",
    "trl_peer",
    "vllm_worker",
    "gpu_profile",
    "gpu_recipe",
    "gpu_update",
}
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def listed() -> list[str]:
    """The names `python -m bench --list` prints (its first column)."""
    out = subprocess.run(
        [sys.executable, "-m", "bench", "--list"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    return [m.group(1) for m in re.finditer(r"^([a-z_0-9]+) +[0-9.]+ ", out, flags=re.M)]


def test_the_registry_lists_every_benchmark_module_once() -> None:
    modules = sorted(p.stem for p in BENCH.glob("*.py") if p.stem not in NOT_BENCHMARKS)
    names = listed()
    assert len(names) == len(set(names))
    assert sorted(names) == modules


def test_no_benchmark_edits_sys_path_or_imports_tests_or_private_names() -> None:
    bad = []
    for path in sorted(BENCH.glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and node.attr == "path"
                and getattr(node.value, "id", "") == "sys"
            ):
                bad.append(f"{path.name}:{node.lineno} uses sys.path")
            if isinstance(node, ast.ImportFrom) and node.module:
                if node.module.split(".")[0] in {"conftest", "tests"}:
                    bad.append(f"{path.name}:{node.lineno} imports {node.module}")
                if node.module.startswith("tirl"):
                    bad += [
                        f"{path.name}:{node.lineno} imports {node.module}.{a.name}"
                        for a in node.names
                        if a.name.startswith("_")
                    ]
            if isinstance(node, ast.Import):
                bad += [
                    f"{path.name}:{node.lineno} imports {a.name}" for a in node.names if a.name == "conftest"
                ]
    assert not bad, "\n".join(bad)


def test_every_result_file_the_docs_cite_exists() -> None:
    cited = {m for page in DOCS for m in re.findall(r"bench/results/([\w.-]+\.json)", page.read_text())}
    assert cited, "the docs cite no result file: the pattern is stale"
    missing = sorted(name for name in cited if not (BENCH / "results" / name).is_file())
    assert not missing, f"docs cite result files that bench/results/ lacks: {missing}"


def test_result_files_name_what_was_measured_not_the_machine() -> None:
    odd = [
        p.name
        for p in (BENCH / "results").glob("*.json")
        if re.search(r"_[a-h]\.json$|_[a-h]_|issue\d", p.name)
    ]
    assert not odd, f"machine letters or issue numbers in result names (put the machine inside): {odd}"


def test_no_argument_lists_the_benchmarks_and_runs_none(monkeypatch, capsys) -> None:
    """The suite takes hours and rewrites tracked results: `python -m bench` alone prints what it could run."""
    monkeypatch.syspath_prepend(str(ROOT))
    cli = importlib.import_module("bench.__main__")
    ran: list[str] = []
    monkeypatch.setattr(cli, "run", lambda b, args: (ran.append(b.name), (0, 0.0))[1])  # nothing really runs
    with pytest.raises(SystemExit) as exit_:
        cli.main([])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and ran == []
    assert "--all" in err and "engine_batching" in err  # the usage and the list
    assert cli.main(["--all", "--max-minutes", "0.5"]) == 0
    assert ran == [b.name for b in cli.BENCHMARKS if b.default and b.minutes <= 0.5]


@pytest.mark.parametrize("workload", ["demo", "smollm2"])
def test_every_rl_stream_mode_passes_the_start_rules_on_its_workload(workload, tmp_path) -> None:
    from bench import rl_stream

    from tirl.commands.run_config import TirlConfig
    from tirl.core.config import load_config

    heldout = rl_stream.arith_heldout(tmp_path / "heldout.jsonl", 4)
    checked = rl_stream.dry_run(workload, tmp_path / "MODEL", heldout)
    assert set(checked) == set(rl_stream.MODES)
    assert [m for m, c in checked.items() if c["stream"]] == ["stream_k1", "stream_k2", "stream_k1_partial"]
    args = rl_stream.overrides(workload, tmp_path / "MODEL", "http://127.0.0.1:1", heldout, "synchronous")
    cfg = load_config(TirlConfig, rl_stream.base_config(workload), args)
    # the demo workload is the demo's own RL stage (its batch and turns), only the engine and the steps set here
    assert (cfg.rl.prompts_per_step, cfg.rl.n, cfg.agent.max_turns) == (
        (32, 8, 16) if workload == "demo" else (4, 4, 4)
    )
    assert cfg.rollout.engine == "vllm" and cfg.threads == 1
