"""RL loop variants: DAPO dynamic sampling and overlong filtering, on scripted trajectories and scores."""

import torch

from conftest import make_agent, make_model, rl_trainer
from tirl.rewards.scoring import Score
from tirl.rollout.sampling import SamplingParams
from tirl.rollout.types import Origin
from tirl.train.optim import OptimConfig
from tirl.train.rl.sampling import Ahead, Dynamic, Synchronous
from tirl.train.rl.trainer import RLConfig

ROW = {"prompt": [{"role": "user", "content": "What is 2 * 3?"}], "reward_model": {"ground_truth": "6"}}


def _trainer(tokenizer, renderer, sandbox, tmp_path, **rl):
    model = make_model(tokenizer)
    agent = make_agent(model, renderer, sandbox, max_tokens=12)
    cfg = RLConfig(
        steps=1,
        prompts_per_step=2,
        n=2,
        mini_batch_size=8,
        optim=OptimConfig(lr=1e-2, weight_decay=0.0),
        **rl,
    )
    t = rl_trainer(model, tokenizer, agent, [ROW] * 8, cfg, tmp_path)
    return t, model


def _scripted_rollout(trainer, rewards_by_round, stop_reason="answer"):
    """Replace the generation + scoring of a round by real sampled trajectories with planted rewards."""
    rounds = iter(rewards_by_round)

    def rollout(rows, first_group, *, step, gen=None):
        rewards = next(rounds)
        prompts = [r.prompt for r in rows for _ in range(trainer.run.cfg.n)]
        n = trainer.run.cfg.n
        origins = [Origin(r, sample=k, group=first_group + g) for g, r in enumerate(rows) for k in range(n)]
        trajs = trainer.run.agent.run(prompts, SamplingParams(), origins=origins, generator=trainer.gen)
        for t in trajs:
            t.stop_reason = stop_reason
        return trajs, [Score(r, r > 0, None) for r in rewards]

    trainer.sampling_mode.rollouts.sample = rollout


def test_dynamic_sampling_refills_with_groups_that_have_a_signal(tokenizer, renderer, sandbox, tmp_path):
    t, _ = _trainer(tokenizer, renderer, sandbox, tmp_path, dynamic_sampling=True, dynamic_max_rounds=3)
    # round 0: group 0 all equal (dropped), group 1 has a signal; round 1: group 2 signal, group 3 dropped
    _scripted_rollout(t, [[-0.9, -0.9, 1.0, -1.0], [1.0, -1.0, 0.5, 0.5], [1.0, -1.0, 1.0, -1.0]])
    batch = t.sampling_mode.batch(0)
    trajs, scores, stats = batch.trajs, batch.scores, batch.metrics
    assert stats == {"dynamic/rounds": 1.0, "dynamic/groups_drawn": 4.0, "dynamic/groups_kept": 2.0}
    assert [tr.group for tr in trajs] == [1, 1, 2, 2]
    assert [s.reward for s in scores] == [1.0, -1.0, 1.0, -1.0]


def test_dynamic_sampling_stops_at_the_round_cap(tokenizer, renderer, sandbox, tmp_path):
    t, _ = _trainer(tokenizer, renderer, sandbox, tmp_path, dynamic_sampling=True, dynamic_max_rounds=2)
    _scripted_rollout(t, [[-1.0] * 4, [-1.0] * 4, [1.0, -1.0, 1.0, 1.0], [1.0, -1.0] * 2])
    batch = t.sampling_mode.batch(0)
    trajs, stats = batch.trajs, batch.metrics
    assert stats["dynamic/rounds"] == 2.0 and stats["dynamic/groups_drawn"] == 6.0
    assert stats["dynamic/groups_kept"] == 1.0 and [tr.group for tr in trajs] == [4, 4]


def test_overlong_filter_masks_truncated_responses(tokenizer, renderer, sandbox, tmp_path):
    for filtered in (True, False):
        t, model = _trainer(tokenizer, renderer, sandbox, tmp_path, overlong_filter=filtered)
        _scripted_rollout(t, [[1.0, -1.0, 1.0, -1.0]], stop_reason="budget")
        before = [p.detach().clone() for p in model.parameters()]
        m = t.step()
        assert m["rollout/truncated"] == 1.0
        changed = any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
        assert changed is not filtered  # every response was cut off: with the filter nothing is learned


def test_each_sampling_setting_picks_its_mode(tokenizer, renderer, sandbox, tmp_path):
    """`rl.*` names the mode once (`tirl.train.rl.sampling`); the streaming one is built in tests/train/test_stream.py."""
    for rl, mode in (
        ({}, Synchronous),
        ({"dynamic_sampling": True}, Dynamic),
        ({"off_policy_steps": 1}, Ahead),
    ):
        t, _ = _trainer(tokenizer, renderer, sandbox, tmp_path, **rl)
        assert type(t.sampling_mode) is mode, rl
        assert t.rank_state == ("generator", *(("pending",) if mode is Ahead else ()))
