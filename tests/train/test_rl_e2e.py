"""A short RL run on a tiny model: the mean reward must rise (real engine, agent loop, rewards, GRPO, PPO loss)."""

import pytest
import torch

from conftest import make_agent, make_model, rl_trainer
from tirl.train.optim import OptimConfig
from tirl.train.rl.trainer import RLConfig
from tirl.train.sft import SFTConfig, train_sft

PROMPT = [{"role": "user", "content": "Pick a number."}]


@pytest.mark.slow
def test_rl_raises_mean_reward(tokenizer, renderer, sandbox, tmp_path):
    torch.manual_seed(0)
    model = make_model(tokenizer).train()
    # SFT: answer with a uniformly random digit, so the target digit starts at about 10%
    sft_rows = [
        {"messages": PROMPT + [{"role": "assistant", "content": f"\\boxed{{{d}}}"}]}
        for d in list(range(10)) * 20
    ]
    train_sft(
        model,
        renderer,
        sft_rows,
        SFTConfig(epochs=8, batch_size=20, optim=OptimConfig(lr=3e-3)),
        pad_id=tokenizer.pad_token_id,
        seed=0,
    )
    agent = make_agent(model, renderer, sandbox, max_tokens=16)
    rows = [{"prompt": PROMPT, "reward_model": {"ground_truth": "7"}}] * 8
    cfg = RLConfig(
        steps=10, prompts_per_step=8, n=8, mini_batch_size=32, optim=OptimConfig(lr=1e-3, weight_decay=0.0)
    )
    trainer = rl_trainer(model, tokenizer, agent, rows, cfg, tmp_path)
    history = trainer.train()
    first, last = history[0]["reward/mean"], sum(h["reward/mean"] for h in history[-2:]) / 2
    assert first < -0.5, first
    assert last > first + 0.3, [round(h["reward/mean"], 2) for h in history]
    assert (tmp_path / "model" / "config.json").is_file()  # the final checkpoint was written
    assert 0 <= history[-1]["loss/clipfrac"] <= 1
