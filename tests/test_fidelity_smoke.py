"""The recipe configs, 1 step on CPU with a tiny Qwen-shaped model: recipe fidelity end to end, step-0 validation with
logged generations, `tirl check-tokens` reading the rollouts' verl token stream from the run's config, and verl's SFT
loss."""

import json
from pathlib import Path

import pytest

from conftest import make_model, sample_conversation
from tirl.cli import main
from tirl.tasks.arith.problems import generate_problems

CONFIGS = Path(__file__).parents[1] / "src" / "tirl" / "configs"
SMALL = [  # the recipe's sizes are for 8 GPUs; everything else stays as the recipe config sets it
    "rollout.engine=torch",
    "model.gradient_checkpointing=false",
    "rl.steps=1",
    "rl.prompts_per_step=2",
    "rl.n=2",
    "rl.mini_batch_size=4",
    "rl.micro_batch_tokens=0",
    "rl.micro_batch_size=2",
    "eval.n=2",
    "eval.ks=[1,2]",
    "eval.log_generations=2",
    "agent.max_response_tokens=24",
    "agent.max_tokens_per_turn=24",
    "reward.overlong_max_len=24",
    "reward.overlong_buffer=8",
]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["qwen3-4b-grpo-tcr", "qwen2.5-7b-grpo-tcr"])
def test_recipe_rl_config_one_step(name, tokenizer, tmp_path, monkeypatch):
    monkeypatch.setenv("TIRL_QUIET", "1")
    # the recipe's prompts (its system prompt with the tool schema) run to ~1,150 tokens with the test tokenizer,
    # and tirl refuses prompts that cannot fit the model's positions with their response
    model = make_model(tokenizer, max_positions=2048)
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    rows = [p.to_row() for p in generate_problems(6, seed=1)]
    (tmp_path / "rl.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:4]))
    (tmp_path / "val.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[4:]))
    out = tmp_path / "run"
    args = [f"model.path={tmp_path / 'model'}", f"rl.data={tmp_path / 'rl.jsonl'}"]
    args += [f"rl.validation.data=[{tmp_path / 'val.jsonl'}]", *SMALL]
    assert main(["rl", "--config", str(CONFIGS / f"recipe-{name}.yaml"), *args, "--out", str(out)]) == 0

    resolved = (out / "config.yaml").read_text()
    for line in ("fidelity: recipe", "grading: math_dapo", "token_stream: verl", "token_mean: micro"):
        assert line in resolved
    val = out / "eval" / "step-000000"  # validation before the first step
    summary = json.loads((val / "summary.json").read_text())
    (source,) = summary
    assert {"pass@2", "maj@2", "bootstrap_best@2", "bootstrap_maj@2"} <= set(summary[source])
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert any(f"val/{source}/bootstrap_best@2" in m for m in metrics)
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    generations = [s for s in samples if s["key"] == "val/generations"]
    assert len(generations) == 1 and generations[0]["text"].count("# ") >= 2
    assert (out / "model").is_dir()

    trajs = val / "trajectories.jsonl"
    assert main(["check-tokens", str(trajs)]) == 0  # the stream comes from the run's config: verl
    if any(json.loads(line)["tool_calls"] for line in trajs.read_text().splitlines()):
        assert main(["check-tokens", str(trajs), "--stream", "tirl"]) == 1


@pytest.mark.slow
@pytest.mark.parametrize("name", ["qwen3-4b-sft", "qwen2.5-7b-sft"])
def test_recipe_sft_config_one_step(name, tokenizer, tmp_path, monkeypatch):
    monkeypatch.setenv("TIRL_QUIET", "1")
    model = make_model(tokenizer)
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    (tmp_path / "sft.jsonl").write_text((json.dumps({"messages": sample_conversation()}) + "\n") * 4)
    out = tmp_path / "run"
    args = [f"model.path={tmp_path / 'model'}", f"sft.data={tmp_path / 'sft.jsonl'}", "sft.epochs=1"]
    args += [
        "sft.batch_size=4",
        "sft.micro_batch_size=2",
        "sft.save_every=0",
        "model.gradient_checkpointing=false",
    ]
    assert main(["sft", "--config", str(CONFIGS / f"recipe-{name}.yaml"), *args, "--out", str(out)]) == 0
    assert "loss_mean: micro" in (out / "config.yaml").read_text()
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 1 and metrics[0]["sft/loss"] > 0
