"""Open registries of advantage estimators and policy losses: registration, signature checks, lookups, checks."""

from functools import partial

import pytest
import torch
from torch.testing import assert_close

from tirl.algorithms import (
    ADVANTAGE_ESTIMATORS,
    POLICY_LOSSES,
    AdvantageOptions,
    PassKOptions,
    check_advantage,
    get_advantage_estimator,
    get_policy_loss,
    grpo,
    policy_loss,
    register_advantage,
    register_policy_loss,
)

REWARDS = torch.tensor([1.0, 0.0, 0.0, 1.0])
GROUPS = torch.tensor([0, 0, 1, 1])


@pytest.fixture(autouse=True)
def scratch_registries(monkeypatch):
    """Each test registers into copies, so the built-in registries stay as they are for the rest of the run."""
    monkeypatch.setattr(ADVANTAGE_ESTIMATORS, "_items", dict(ADVANTAGE_ESTIMATORS._items))
    monkeypatch.setattr(POLICY_LOSSES, "_items", dict(POLICY_LOSSES._items))


def best_minus_rest(rewards, group_ids, *, scale: float = 1.0):
    return scale * (rewards - grpo(rewards, group_ids, normalize_std=False))


def test_registered_estimator_binds_its_hyperparameters():
    register_advantage("scaled", best_minus_rest)
    assert "scaled" in ADVANTAGE_ESTIMATORS and ADVANTAGE_ESTIMATORS["scaled"].hyperparameters == {"scale"}
    fn = get_advantage_estimator("scaled", scale=2.0, k=3)  # k: not its hyperparameter, ignored
    assert_close(fn(REWARDS, GROUPS), torch.tensor([1.0, 1.0, 1.0, 1.0]))
    register_advantage("half", partial(best_minus_rest, scale=0.5))
    assert_close(get_advantage_estimator("half")(REWARDS, GROUPS), torch.full((4,), 0.25))


def test_duplicate_names_raise_unless_replaced():
    with pytest.raises(ValueError, match="advantage estimator 'grpo' is already registered"):
        register_advantage("grpo", best_minus_rest)
    register_advantage("grpo", best_minus_rest, replace=True)
    assert ADVANTAGE_ESTIMATORS["grpo"].fn is best_minus_rest
    with pytest.raises(ValueError, match="policy loss 'ppo' is already registered"):
        register_policy_loss("ppo", policy_loss)
    with pytest.raises(ValueError, match="needs a non-empty name"):
        register_advantage("", best_minus_rest)


def test_signatures_are_checked_at_registration():
    with pytest.raises(
        ValueError, match=r"'one' has the signature \(rewards\); it needs 2 positional tensors"
    ):
        register_advantage("one", lambda rewards: rewards)
    with pytest.raises(ValueError, match=r"no \*args or \*\*kwargs"):
        register_advantage("kw", lambda rewards, group_ids, **hyper: rewards)
    with pytest.raises(ValueError, match="not callable"):
        register_advantage("x", 3)  # type: ignore[arg-type]

    def no_norm(logp, old_logp, advantages, loss_mask, *, clip_low, clip_high, clip_c, agg):
        return logp.sum(), {}

    with pytest.raises(ValueError, match="including agg, norm_len, num_tokens, num_seqs"):
        register_policy_loss("no_norm", no_norm)
    assert "no_norm" not in POLICY_LOSSES


def test_registered_policy_loss_is_looked_up():
    def plain_pg(logp, old_logp, advantages, loss_mask, *, clip_low, clip_high, clip_c, agg, norm_len=None,
                 num_tokens=None, num_seqs=None):  # fmt: skip
        return -(advantages[:, None] * logp * loss_mask).sum(), {}

    assert register_policy_loss("plain_pg", plain_pg) is plain_pg
    assert get_policy_loss("plain_pg") is plain_pg and get_policy_loss("ppo") is policy_loss
    with pytest.raises(ValueError, match=r"unknown policy loss 'reinforce'; valid: \[.*'plain_pg', 'ppo'\]"):
        get_policy_loss("reinforce")


def test_registries_are_read_only_mappings():
    with pytest.raises(TypeError):
        ADVANTAGE_ESTIMATORS["x"] = ADVANTAGE_ESTIMATORS["grpo"]  # type: ignore[index]
    with pytest.raises(KeyError):
        ADVANTAGE_ESTIMATORS["gae"]
    assert ADVANTAGE_ESTIMATORS.get("gae") is None


def test_estimators_check_their_own_hyperparameters():
    check_advantage("passk", group_size=4, k=4)
    check_advantage("grpo", group_size=4, k=9)  # grpo takes no k: nothing to check
    for name in ("passk", "pkpo"):
        with pytest.raises(ValueError, match=r"k=5 must be in \[1, the group size 4\]"):
            check_advantage(name, group_size=4, k=5)
    with pytest.raises(ValueError, match="unknown advantage estimator 'gae'"):
        check_advantage("gae", group_size=4)

    def even_groups(*, group_size, scale):
        if group_size % 2:
            raise ValueError(f"needs an even group size, got {group_size}")

    register_advantage("even", best_minus_rest, check=even_groups)
    check_advantage("even", group_size=4, scale=1.0)
    with pytest.raises(ValueError, match="needs an even group size, got 3"):
        check_advantage("even", group_size=3, scale=1.0)
    with pytest.raises(ValueError, match="advantage check 'bad'"):
        register_advantage("bad", best_minus_rest, check=lambda n: None)


def test_rl_config_asks_the_estimator_not_its_name():
    from tirl.demo.compare import objectives
    from tirl.train.rl.trainer import RLConfig

    with pytest.raises(
        ValueError, match=r"rl.advantage.name='pkpo' with rl.n=4, rl.advantage.k=5: k=5 must be in"
    ):
        RLConfig(advantage=PassKOptions(name="pkpo", k=5), n=4)
    RLConfig(advantage=AdvantageOptions(name="grpo"), n=4)  # grpo has no k to check

    def at_most_k(rewards, group_ids, *, k):
        return best_minus_rest(rewards, group_ids)

    register_advantage(
        "my_passk",
        at_most_k,
        check=lambda *, group_size, k: check_advantage("passk", group_size=group_size, k=k),
        options=PassKOptions,
    )
    with pytest.raises(ValueError, match="rl.advantage.name='my_passk'"):
        RLConfig(advantage=PassKOptions(name="my_passk", k=3), n=2)
    assert objectives() == ["my_passk", "passk", "pkpo"]  # `tirl demo --compare`: the estimators that take k
