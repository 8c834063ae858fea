"""`tirl demo --seeds N`: the cross-seed summary (numbers checked by hand on synthetic runs), and the sweep end to end
at toy size."""

import json

import numpy as np
import pytest
import yaml

from test_demo_smoke import TOY
from tirl.cli import main
from tirl.commands.run_config import TirlConfig
from tirl.core.config import to_dict
from tirl.demo.seeds import crossover_k, finished, lift_interval, run_seeds, seed_config, summarize


def _entry(pass_k, maj2=0.5, tools=1.0):
    return {
        "pass@1": pass_k[0], "num_problems": 3, "samples_per_problem": 2,
        "pass@k": {"1": pass_k[0], "2": pass_k[1]}, "maj@k": {"1": pass_k[0], "2": maj2},
        "tool_calls_per_response": tools, "tool_error_rate": 0.1, "no_tool_share": 0.0, "response_tokens": 50.0,
    }  # fmt: skip


def _fake_run(out, sft_correct, rl_correct, sft_k, rl_k):
    """A finished demo directory: report.json and both evaluations' records (2 samples of problems p0..p2)."""
    for label, correct in (("sft", sft_correct), ("rl", rl_correct)):
        (out / f"eval-{label}").mkdir(parents=True)
        rows = [
            {"problem_id": f"p{p}", "sample_index": i, "correct": bool(correct[p][i])}
            for p in range(3)
            for i in range(2)
        ]
        (out / f"eval-{label}" / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    seconds = {"sft": 10.0, "sft cpu": 19.0, "rl": 20.0}  # wall seconds and one stage's CPU seconds
    report = {"sft": _entry(sft_k), "rl": _entry(rl_k, tools=2.0), "seconds": seconds}
    (out / "report.json").write_text(json.dumps({**report, "analysis": "x"}))


def test_summary_means_ranges_lift_and_crossover(tmp_path):
    # seed 0: per-problem lift (1 - 0.5, 0.5 - 0, 1 - 1) = (0.5, 0.5, 0); seed 1: (0, 1, -0.5)
    _fake_run(tmp_path / "s0", [[1, 0], [0, 0], [1, 1]], [[1, 1], [1, 0], [1, 1]], (0.5, 0.8), (0.83, 0.83))
    _fake_run(tmp_path / "s1", [[1, 1], [0, 0], [1, 0]], [[1, 1], [1, 1], [0, 0]], (0.5, 0.9), (0.67, 0.7))
    s = summarize({0: tmp_path / "s0", 1: tmp_path / "s1"})
    p1 = s["metrics"]["pass@1"]
    assert p1["sft"] == {"mean": 0.5, "min": 0.5, "max": 0.5}
    assert p1["rl-sft"]["min"] == pytest.approx(0.17) and p1["rl-sft"]["max"] == pytest.approx(0.33)
    assert s["metrics"]["tool_calls_per_response"]["rl-sft"]["mean"] == 1.0
    lift = s["lift_pass@1"]
    assert lift["mean"] == pytest.approx((1.0 / 3 + 0.5 / 3) / 2)  # the mean of the per-seed mean lifts
    assert lift["lo"] <= lift["mean"] <= lift["hi"]
    assert s["crossover_k"] == {"0": None, "1": 2} and s["crossover_repeats"] is False
    assert s["seconds"] == {"0": 30.0, "1": 30.0}
    assert s["machine"]["cores"] >= 1 and isinstance(s["machine"]["flags"], list)


def test_lift_interval_narrows_with_more_seeds_and_sits_on_a_constant_lift():
    rng = np.random.default_rng(1)
    few = [rng.normal(0.2, 0.3, 200) for _ in range(2)]
    many = few + [rng.normal(0.2, 0.3, 200) for _ in range(6)]
    w_few = np.subtract(*lift_interval(few)[2:0:-1])
    w_many = np.subtract(*lift_interval(many)[2:0:-1])
    assert w_many < w_few
    assert lift_interval([np.full(50, 0.25)] * 3) == pytest.approx((0.25, 0.25, 0.25))


def test_crossover_is_the_first_k_where_sft_catches_up():
    report = {
        "sft": {"pass@k": {"1": 0.4, "2": 0.6, "4": 0.9}},
        "rl": {"pass@k": {"1": 0.6, "2": 0.7, "4": 0.85}},
    }
    assert crossover_k(report) == 4


def test_a_finished_seed_is_reused_only_with_the_same_config(tmp_path):
    cfg = seed_config(TirlConfig(out_dir=str(tmp_path)), 3)
    assert cfg.seed == 3 and cfg.out_dir == str(tmp_path / "seed-3")
    out = tmp_path / "seed-3"
    _fake_run(out, [[1, 0]] * 3, [[1, 1]] * 3, (0.5, 0.8), (1.0, 1.0))
    (out / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg)))
    assert finished(cfg)
    other = seed_config(TirlConfig(out_dir=str(tmp_path), rl=TirlConfig().rl.__class__(steps=99)), 3)
    assert not finished(other)
    (out / "report.json").write_text("{not json")  # a report cut short: run again
    assert not finished(cfg)


def test_run_seeds_runs_each_missing_seed_once(tmp_path):
    calls = []

    def fake_demo(cfg):
        calls.append(cfg.seed)
        _fake_run(tmp_path / f"seed-{cfg.seed}", [[1, 0]] * 3, [[1, 1]] * 3, (0.5, 0.8), (1.0, 1.0))

    cfg = TirlConfig(out_dir=str(tmp_path), seed=5)
    summary = run_seeds(cfg, 2, fake_demo)
    assert calls == [5, 6] and summary["seeds"] == [5, 6]
    assert json.loads((tmp_path / "seeds.json").read_text())["lift_pass@1"]["mean"] == pytest.approx(0.5)


@pytest.mark.slow
def test_demo_seeds_end_to_end(tmp_path, monkeypatch):
    monkeypatch.setenv("TIRL_QUIET", "1")
    out = tmp_path / "demo"
    args = ["demo", "--seeds", "2", f"out_dir={out}", *TOY, "rl.steps=1", "rl.mini_batch_size=16"]
    assert main(args) == 0
    summary = json.loads((out / "seeds.json").read_text())
    assert summary["seeds"] == [0, 1] and summary["problems"] == 6
    for s in (0, 1):
        assert (out / f"seed-{s}" / "report.json").is_file()
    assert yaml.safe_load((out / "seed-1" / "config.yaml").read_text())["seed"] == 1
    mtime = (out / "seed-0" / "report.json").stat().st_mtime_ns
    assert main(args) == 0  # both seeds reused: only the summary is written again
    assert (out / "seed-0" / "report.json").stat().st_mtime_ns == mtime
