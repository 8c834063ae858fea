"""One RL step on scripted trajectories: the on-policy shortcut equals recomputing old log-probs."""

import copy

import torch

from conftest import make_agent, make_model
from tirl.rewards.shaping import RewardConfig
from tirl.rollout.sampling import SamplingParams
from tirl.train.optim import OptimConfig
from tirl.train.rl import RLConfig, RLTrainer, trajectory_batch


def _trainer(model, tokenizer, renderer, sandbox, tmp_path, mini_batch):
    agent = make_agent(model, renderer, sandbox, max_tokens=12)
    rows = [
        {"prompt": [{"role": "user", "content": "What is 2 * 3?"}], "reward_model": {"ground_truth": "6"}}
    ]
    cfg = RLConfig(steps=1, prompts_per_step=2, n=4, mini_batch_size=mini_batch, optim=OptimConfig(lr=1e-3))
    return RLTrainer(
        model,
        tokenizer,
        agent,
        rows,
        cfg,
        sampling=SamplingParams(),
        reward=RewardConfig(),
        out_dir=tmp_path,
        seed=0,
    )


def test_on_policy_update_equals_recomputed_old_logprobs(tokenizer, renderer, sandbox, tmp_path):
    torch.manual_seed(0)
    a = make_model(tokenizer)
    b = copy.deepcopy(a)
    ta = _trainer(a, tokenizer, renderer, sandbox, tmp_path / "a", mini_batch=8)
    tb = _trainer(b, tokenizer, renderer, sandbox, tmp_path / "b", mini_batch=8)
    trajs = ta.agent.run(
        [[{"role": "user", "content": "What is 2 * 3?"}]] * 8,
        SamplingParams(),
        metas=[{"ground_truth": "6"}] * 8,
        generator=torch.Generator().manual_seed(1),
    )
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 1.0, -1.0, 0.0, 0.0])
    batch = trajectory_batch(trajs, adv, pad_id=tokenizer.pad_token_id)
    ta.gen.manual_seed(0)
    tb.gen.manual_seed(0)
    stats_a = ta._update(batch, None, None)  # on-policy shortcut
    stats_b = tb._update(batch, tb._logprobs(b, batch), None)  # explicit recomputation
    for pa, pb in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(pa, pb)
    assert abs(stats_a["loss/pg"] - stats_b["loss/pg"]) < 1e-6
    assert stats_a["loss/clipfrac"] == 0.0  # ratio is exactly 1 on the only update
    assert any((pa != pc).any() for pa, pc in zip(a.parameters(), make_model(tokenizer).parameters()))
