"""Exactness items of the RL algorithm: each test failed before its fix (issue 13, part 1)."""

import pytest
import torch

from tirl.algorithms import equal_reward_groups, get_advantage_estimator
from tirl.rewards.shaping import RewardConfig, shape_reward
from tirl.train.optim import NonFiniteError, OptimConfig, SkipGuard, build_optimizer, clip_and_step
from tirl.train.rl.trainer import RLConfig


@pytest.mark.parametrize("name", ["grpo", "drgrpo", "rloo"])
@pytest.mark.parametrize("value", [-0.9, 0.1, -1.1, 0.3, 1e-7])
def test_all_equal_group_gets_exactly_zero(name, value):
    # float32 cannot represent these values; the old float32 mean left rounding noise that the std division
    # blew up to about +-0.06 per member for grpo.
    rewards = torch.tensor([value] * 16 + [1.0, -1.0], dtype=torch.float32)
    groups = torch.tensor([0] * 16 + [1, 1])
    adv = get_advantage_estimator(name)(rewards, groups)
    assert adv.dtype == torch.float32
    assert torch.equal(adv[:16], torch.zeros(16))
    assert adv[16] > 0 > adv[17]


def test_equal_reward_groups_counts_groups_not_samples():
    rewards = torch.tensor([-0.9, -0.9, -0.9, 1.0, -1.0, 0.5, 0.5])
    groups = torch.tensor([5, 5, 5, 2, 2, 9, 9])  # any ids, any order
    eq = equal_reward_groups(rewards, groups)  # groups sorted by id: 2, 5, 9
    assert eq.tolist() == [False, True, True]


def test_group_of_one_is_refused_at_start_up():
    with pytest.raises(ValueError, match="group of one.*learns nothing"):
        RLConfig(n=1)
    RLConfig(n=2)


def test_reference_tool_term_scores_every_wrong_answer_minus_1_1():
    cfg = RewardConfig(tool_call_bonus=True, tool_call_count="reference")
    for calls in (0, 1, 3, 10):
        reward, parts = shape_reward(-1.0, num_tool_calls=calls, response_len=5, config=cfg, max_len=100)
        assert reward == pytest.approx(-1.1) and parts["reward/tool_term"] == pytest.approx(-0.1)
    assert shape_reward(1.0, num_tool_calls=3, response_len=5, config=cfg, max_len=100)[0] == 1.0
    executed = RewardConfig(tool_call_bonus=True)
    assert shape_reward(-1.0, num_tool_calls=2, response_len=5, config=executed, max_len=100)[
        0
    ] == pytest.approx(-0.8)
    with pytest.raises(ValueError, match="tool_call_count"):
        RewardConfig(tool_call_count="turns")


def test_adamw_defaults_are_verls():
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.LayerNorm(3))
    opt, _ = build_optimizer(model, OptimConfig(), 10)
    assert opt.defaults["betas"] == (0.9, 0.999)
    decayed = [p for g in opt.param_groups if g["weight_decay"] > 0 for p in g["params"]]
    assert len(decayed) == 4  # verl decays every parameter, biases and norm weights included
    opt, _ = build_optimizer(model, OptimConfig(decay_all=False), 10)
    decayed = [p for g in opt.param_groups if g["weight_decay"] > 0 for p in g["params"]]
    assert len(decayed) == 1  # only the Linear weight


def _snapshot(model, opt):
    params = [p.detach().clone() for p in model.parameters()]
    state = {k: {n: t.clone() for n, t in v.items() if torch.is_tensor(t)} for k, v in opt.state.items()}
    return params, state


def test_non_finite_update_changes_nothing_and_repeats_stop():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    cfg = OptimConfig(lr=0.1, max_skipped_in_row=2)
    opt, sched = build_optimizer(model, cfg, 10)
    model(torch.randn(3, 4)).sum().backward()
    assert clip_and_step(model, opt, sched, cfg)[1]  # one good step: AdamW has moments now
    params, state = _snapshot(model, opt)
    lr = sched.get_last_lr()
    guard = SkipGuard(cfg.max_skipped_in_row)
    for i, bad in enumerate((float("nan"), float("inf"))):
        out = model(torch.randn(3, 4)).sum() * bad
        out.backward()
        norm, stepped = clip_and_step(model, opt, sched, cfg, loss=out.item())
        assert not stepped
        after, after_state = _snapshot(model, opt)
        for a, b in zip(params, after):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
        for k in state:
            for n in state[k]:
                torch.testing.assert_close(state[k][n], after_state[k][n], rtol=0, atol=0)
        assert sched.get_last_lr() == lr and all(p.grad is None for p in model.parameters())
        if i == 1:  # the second skip in a row
            with pytest.raises(NonFiniteError, match="2 updates in a row"):
                guard.record(stepped, where="test")
        else:
            guard.record(stepped, where="test")
    guard.in_row = 0
    guard.record(True, where="test")
    assert guard.total == 2 and guard.in_row == 0


def test_finite_grad_but_non_finite_loss_is_skipped():
    model = torch.nn.Linear(2, 1)
    cfg = OptimConfig(lr=0.1)
    opt, sched = build_optimizer(model, cfg, 10)
    model(torch.ones(1, 2)).sum().backward()
    before = [p.detach().clone() for p in model.parameters()]
    assert clip_and_step(model, opt, sched, cfg, loss=float("nan"))[1] is False
    for a, b in zip(before, model.parameters()):
        assert torch.equal(a, b)


def test_sft_defaults_are_the_recipe_sft_trainers():
    """verl's sft_trainer.yaml (the recipe's SFT): AdamW lr 1e-5, betas (0.9, 0.95), wd 0.01, 10% warm-up, cosine;
    the RL trainer keeps (0.9, 0.999)."""
    from tirl.train.rl.trainer import RLConfig
    from tirl.train.sft import SFTConfig

    o = SFTConfig().optim
    assert (o.lr, o.beta1, o.beta2, o.weight_decay, o.warmup_ratio, o.schedule) == (
        1e-5,
        0.9,
        0.95,
        0.01,
        0.1,
        "cosine",
    )
    assert RLConfig().optim.beta2 == 0.999
