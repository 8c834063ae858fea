"""`tirl demo` end to end at toy size: every stage runs and the report has the promised shape."""

import json

import pytest

from tirl.cli import main

TOY = [  # every stage at toy size
    "task.num_sft=64",
    "task.num_rl=32",
    "task.num_test=6",
    "demo.warmup.epochs=1",
    "sft.epochs=1",
    "rl.prompts_per_step=4",
    "rl.n=4",
    "eval.n=4",
    "agent.max_response_tokens=96",
    "agent.max_tokens_per_turn=48",
]


@pytest.mark.slow
def test_demo_pipeline_writes_report(tmp_path, monkeypatch):
    monkeypatch.setenv("TIRL_QUIET", "1")
    out = tmp_path / "demo"
    code = main(["demo", f"out_dir={out}", *TOY, "rl.steps=2", "rl.mini_batch_size=8"])
    assert code == 0
    report = json.loads((out / "report.json").read_text())
    for key in ("sft", "rl"):
        entry = report[key]
        assert 0.0 <= entry["pass@1"] <= 1.0
        assert entry["num_problems"] == 6 and entry["samples_per_problem"] == 4
        assert set(entry["pass@k"]) == {"1", "2", "4"}
    for stage in ("warmup", "sft", "rl", "eval-sft", "eval-rl"):
        assert (out / stage / "config.yaml").is_file()
    records = [json.loads(line) for line in (out / "eval-rl" / "records.jsonl").read_text().splitlines()]
    assert len(records) == 24 and {r["model"] for r in records} == {"rl"}
    assert (out / "rl" / "model" / "config.json").is_file()
    analysis = json.loads((out / "analysis" / "report.json").read_text())
    (comparison,) = analysis["sources"]["tirl/arith"]["comparisons"]
    assert comparison["base"] == "sft" and comparison["other"] == "rl" and comparison["num_problems"] == 6
    assert (
        sum(comparison["solvable"][f"{k}_count"] for k in ("base_only", "other_only", "both", "neither")) == 6
    )
    assert (out / "analysis" / "report.html").is_file() and (out / "analysis" / "trajectories.html").is_file()
    assert analysis["meta"]["runs"][0]["tokenizer"]  # run_eval records the model, so mask spans are decoded


@pytest.mark.slow
def test_demo_compare_trains_both_objectives_and_analyses_three(tmp_path, monkeypatch):
    monkeypatch.setenv("TIRL_QUIET", "1")
    out = tmp_path / "demo"
    # rl.advantage.k is the objective arm's own (the grpo base has no k): its default 4 fits rl.n=4
    toy = [f"out_dir={out}", *TOY, "rl.steps=1", "rl.mini_batch_size=16"]
    assert main(["demo", "--compare", "passk", "--temperatures", "0.6,1.0", *toy]) == 0
    cmp_dir = out / "compare-passk"
    report = json.loads((cmp_dir / "analysis" / "report.json").read_text())
    assert list(report["models"]) == ["sft", "grpo", "passk"]  # SFT first: the baseline of every comparison
    for label in ("sft", "grpo", "passk"):
        temps = {
            json.loads(line)["temperature"] for line in (cmp_dir / f"eval-{label}" / "records.jsonl").open()
        }
        assert temps == {0.6, 1.0}
    assert (out / "rl-passk" / "model" / "config.json").is_file()
    assert "name: passk" in (out / "rl-passk" / "config.yaml").read_text()
    # A second run reuses every checkpoint and only re-evaluates.
    before = (out / "rl-passk" / "model" / "model.safetensors").stat().st_mtime_ns
    assert main(["demo", "--compare", "passk", *toy]) == 0
    assert (out / "rl-passk" / "model" / "model.safetensors").stat().st_mtime_ns == before
