"""LoRA RL on a tiny model: the mean reward rises while only the adapter changes (the base stays bit-identical),
with the KL reference served by the same weights, adapter disabled."""

import pytest
import torch

from conftest import make_agent, make_model, rl_trainer
from tirl.models.loading import ModelConfig, load_policy
from tirl.models.lora import LoraConfig, parameter_counts
from tirl.train.logprobs import token_logprobs
from tirl.train.optim import OptimConfig
from tirl.train.rl.config import KLConfig
from tirl.train.rl.trainer import RLConfig
from tirl.train.sft import SFTConfig, train_sft

PROMPT = [{"role": "user", "content": "Pick a number."}]


def _answer_logp(policy, renderer, digit: str) -> float:
    """log p(assistant says \\boxed{digit} | prompt): the policy's own view, free of sampling noise."""
    ids, mask = renderer.render(PROMPT + [{"role": "assistant", "content": f"\\boxed{{{digit}}}"}])
    ids_t = torch.tensor([ids])
    with torch.no_grad():
        lp, _ = token_logprobs(policy, ids_t, torch.ones_like(ids_t), loss_mask=torch.tensor([mask]))
    return float(lp.sum())


@pytest.mark.slow
def test_lora_rl_raises_mean_reward_and_trains_only_the_adapter(tokenizer, renderer, sandbox, tmp_path):
    torch.manual_seed(0)
    model = make_model(tokenizer).train()
    # SFT (full): answer with a uniformly random digit, so the target digit starts at about 10%
    sft_rows = [
        {"messages": PROMPT + [{"role": "assistant", "content": f"\\boxed{{{d}}}"}]}
        for d in list(range(10)) * 20
    ]
    cfg = SFTConfig(epochs=4, batch_size=20, optim=OptimConfig(lr=5e-3))
    train_sft(model, renderer, sft_rows, cfg, pad_id=tokenizer.pad_token_id, seed=0)
    model.save_pretrained(tmp_path / "sft")  # the base a LoRA checkpoint records
    policy = load_policy(ModelConfig(path=str(tmp_path / "sft"), lora=LoraConfig(rank=8)))
    trainable, total = parameter_counts(policy)
    before = _answer_logp(policy, renderer, "7")
    base = {k: v.clone() for k, v in policy.state_dict().items() if "lora_" not in k}
    agent = make_agent(policy, renderer, sandbox, max_tokens=16)
    rows = [{"prompt": PROMPT, "reward_model": {"ground_truth": "7"}}] * 8
    cfg = RLConfig(
        steps=10,
        prompts_per_step=8,
        n=8,
        mini_batch_size=32,
        kl=KLConfig(coef=0.01),  # the reference is the base with the adapter disabled
        optim=OptimConfig(lr=3e-3, weight_decay=0.0),  # 3x test_rl_e2e full fine-tuning lr (alpha/rank = 4)
    )
    trainer = rl_trainer(policy, tokenizer, agent, rows, cfg, tmp_path)
    assert trainer.run.reference is not None and trainer.run.reference.shares_weights
    history = trainer.train()
    rewards = [round(h["reward/mean"], 2) for h in history]
    first, late = history[0]["reward/mean"], sum(h["reward/mean"] for h in history[-5:]) / 5
    assert first < -0.5, first
    # 64 samples a step make each step's mean reward noisy (std ~0.1): the late average must beat the start, and the
    # policy's own probability of the right answer must have risen
    assert late > first + 0.1, rewards
    assert _answer_logp(policy, renderer, "7") > before + 0.3, (before, rewards)
    assert history[-1]["loss/kl"] > 0  # the adapted policy moved away from its base
    after = policy.state_dict()
    assert all(torch.equal(after[k], v) for k, v in base.items())  # the base never changed
    assert (tmp_path / "model" / "adapter_model.safetensors").is_file()
    print(f"trainable {trainable}/{total}; reward per step {rewards}")
