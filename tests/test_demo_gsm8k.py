"""`tirl demo --model smollm2 --task gsm8k --compare data`, the smoke version: the real SmolLM2-135M-Instruct on
GSM8K through every stage (stitched SFT, one GRPO-TCR step with vLLM, the evaluations, sampling real trajectories
from the stitched-SFT model, SFT on them, the analysis) on a few problems, then the study's data commands on the
trained model: `tirl data filter` (pass rates beside the rows) and `tirl data sample --keep-retokenized`. Slow:
see docs/results/test-suites.json for its time on 2 cores, alone."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tirl.data import read_rows

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_demo_smollm2 import check_tokens, needs_smollm2_and_vllm, run_demo  # noqa: E402

# 8 stitched rows, 4 epochs of 4 (8 SFT steps): enough for the tool format, and the data arm's sampler then tries
# at most 16 problems x 4 samples (at 64 rows it tried 128 x 4, past the test's time limit on a 2-core EPYC)
N_SFT = 8


@needs_smollm2_and_vllm
def test_gsm8k_demo_runs_every_stage_and_the_data_comparison(tmp_path):
    out = tmp_path / "demo"
    run_demo([
        "--model", "smollm2", "--task", "gsm8k", "--compare", "data",
        f"out_dir={out}", f"model.path={tmp_path / 'smollm2'}", f"task.num_sft={N_SFT}", "task.num_rl=8",
        "task.num_test=4", "task.levels=[1,2]", "sft.epochs=4", "sft.batch_size=4", "sft.optim.lr=1e-4", "rl.steps=1",
        "rl.prompts_per_step=2", "rl.n=4", "rl.mini_batch_size=8", "rl.micro_batch_size=8", "eval.n=2",
        "agent.max_response_tokens=128",
    ])  # fmt: skip
    report = json.loads((out / "report.json").read_text())
    assert report["task"] == "gsm8k"
    stages = {"data", "sft", "rl", "eval_base", "eval_sft", "eval_rl", "analyze"}
    assert stages <= set(report["seconds"]), report["seconds"]
    test = read_rows(out / "data" / "test.jsonl")  # the held-out set is saved with the run
    assert len(test) == 4 and all(r["data_source"] == "gsm8k" for r in test)
    stitched = read_rows(out / "data" / "sft.jsonl")
    assert len(stitched) == N_SFT and all(r["style"] == "stitched" for r in stitched)
    # the data preset of tirl compare, in compare-data/: the stitched SFT (the demo's sft/) against SFT on the
    # stitched-SFT model's own correct samples (sft-real/), both evaluated the same way
    compared = json.loads((out / "compare-data" / "report.json").read_text())
    runs = {r["arm"]: r for r in compared["runs"]}
    assert runs["stitched"]["status"] == "done" and compared["study"]["train"] == "sft"
    sampled = json.loads((out / "data" / "sft-real.jsonl.summary.json").read_text())
    assert sampled["rows_written"] <= N_SFT
    # SFT on the sampled rows, evaluated like the stitched one and compared with it
    if sampled["rows_written"]:
        assert runs["real"]["status"] == "done" and (out / "sft-real" / "model").is_dir()
        assert [c["arm"] for c in compared["comparisons"]] == ["real"]
        check_tokens(out / "compare-data", ["stitched", "real"])
    else:  # none correct: every allowed problem was tried (2 per wanted row), 4 samples each
        assert "no correct sampled trajectory" in runs["real"]["error"]
        assert sampled["problems"] == 2 * N_SFT and sampled["samples"] == 4 * sampled["problems"]
    sft = report["summary"]["sft"]["gsm8k"]
    # the stitched SFT taught the tool call: the sandbox ran its code
    assert sft["tool_calls_per_response"] > 0.5
    check_tokens(out, list(report["models"]))  # ids and loss masks re-render exactly
    analysis = json.loads((out / "analysis" / "report.json").read_text())
    assert analysis["models"] == list(report["models"])
    viewer = out / "analysis" / "trajectories-data"  # what trajectories.html loads
    assert (out / "analysis" / "trajectories.html").is_file()
    assert "gsm8k-" in (viewer / "index.js").read_text()
    chunks = [p.read_text() for p in sorted(viewer.glob("chunk-*.js"))]
    # a GSM8K tool call and its output
    assert any("code_interpreter" in c and "tool_response" in c for c in chunks)

    _filter_and_sample_with(out, tmp_path)


def _filter_and_sample_with(out: Path, tmp_path: Path) -> None:
    """The study's data commands on the demo's stitched-SFT model and its 4 held-out problems (torch engine)."""
    from tirl.cli import main

    common = ["--config", str(out / "config.yaml"), "--data", str(out / "data" / "test.jsonl"),
              f"model.path={out / 'sft' / 'model'}", "rollout.engine=torch", "agent.max_response_tokens=64"]  # fmt: skip
    filtered = tmp_path / "rl-filtered.jsonl"
    # the whole band [0, 1]: every problem kept, each with its rate over k = 2 samples
    assert main(["data", "filter", *common, "--out", str(filtered), "--k", "2", "--inclusive"]) == 0
    rows = read_rows(filtered)
    assert len(rows) == 4 and all(r["extra_info"]["filter"]["k"] == 2 for r in rows)
    rates = [r["extra_info"]["filter"]["pass_rate"] for r in rows]
    stats = json.loads((tmp_path / "rl-filtered.jsonl.summary.json").read_text())
    assert stats["never"] + stats["sometimes"] + stats["always"] == 4 == stats["kept"]
    assert stats["never"] == rates.count(0.0) and stats["always"] == rates.count(1.0)
    sampled = tmp_path / "sft-sampled.jsonl"
    code = main(["data", "sample", *common, "--out", str(sampled), "--n", "2", "--keep-retokenized"])
    summary = json.loads((tmp_path / "sft-sampled.jsonl.summary.json").read_text())
    assert code in (0, 1) and summary["samples"] == 8 and summary["retokenized"] <= summary["kept"]
    assert summary["settings"]["keep_retokenized"]
    assert len(read_rows(sampled)) == summary["kept"] if summary["kept"] else sampled.read_text() == ""
