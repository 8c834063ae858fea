"""Advantage estimators against hand-computed values."""

import math

import pytest
import torch
from torch.testing import assert_close

from tirl.algorithms.advantages import ADVANTAGE_ESTIMATORS, get_advantage_estimator, grpo, rloo

EPS = 1e-6


def test_grpo_hand_values() -> None:
    # Group 0: rewards 1, -1, -1 -> mean -1/3, deviations 4/3, -2/3, -2/3,
    # unbiased var = (16/9 + 4/9 + 4/9) / 2 = 4/3, std = 2/sqrt(3).
    # Group 1: all equal -> std 0, advantage 0.
    rewards = torch.tensor([1.0, -1.0, -1.0, 1.0, 1.0, 1.0], dtype=torch.float64)
    groups = torch.tensor([0, 0, 0, 1, 1, 1])
    std = 2 / math.sqrt(3)
    expected = torch.tensor(
        [(4 / 3) / (std + EPS), (-2 / 3) / (std + EPS), (-2 / 3) / (std + EPS), 0.0, 0.0, 0.0],
        dtype=torch.float64,
    )
    assert_close(grpo(rewards, groups), expected)
    # Without eps these are 2/sqrt(3) and -1/sqrt(3).
    assert_close(
        grpo(rewards, groups, eps=0.0)[:3], torch.tensor([2, -1, -1], dtype=torch.float64) / math.sqrt(3)
    )


# Group 7: indices 0, 2, 5 (rewards 1, 0, 2); group -3: indices 1, 4 (rewards 2, 4); group 100: index 3 alone.
UNSORTED_REWARDS = torch.tensor([1.0, 2.0, 0.0, 5.0, 4.0, 2.0], dtype=torch.float64)
UNSORTED_GROUPS = torch.tensor([7, -3, 7, 100, -3, 7])


def test_grpo_unsorted_noncontiguous_groups_and_singleton() -> None:
    # Group 7: mean 1, devs 0, -1, 1, var (0 + 1 + 1) / 2 = 1. Group -3: mean 3, devs -1, 1, var 2 / 1 = 2.
    s2 = math.sqrt(2)
    expected = torch.tensor(
        [0.0, -1 / (s2 + EPS), -1 / (1 + EPS), 0.0, 1 / (s2 + EPS), 1 / (1 + EPS)], dtype=torch.float64
    )
    assert_close(grpo(UNSORTED_REWARDS, UNSORTED_GROUPS), expected)


def test_group_of_one_is_exactly_zero() -> None:
    adv = grpo(torch.tensor([3.0, 5.0]), torch.tensor([0, 1]))
    assert adv.tolist() == [0.0, 0.0]
    assert rloo(torch.tensor([3.0]), torch.tensor([0])).tolist() == [0.0]


def test_drgrpo_subtracts_mean_only() -> None:
    expected = torch.tensor([0.0, -1.0, -1.0, 0.0, 1.0, 1.0], dtype=torch.float64)
    assert_close(grpo(UNSORTED_REWARDS, UNSORTED_GROUPS, normalize_std=False), expected)
    assert_close(get_advantage_estimator("drgrpo")(UNSORTED_REWARDS, UNSORTED_GROUPS), expected)


def test_all_equal_group_is_zero() -> None:
    adv = grpo(torch.full((4,), 0.7), torch.zeros(4, dtype=torch.int64))
    assert_close(adv, torch.zeros(4))


def test_grpo_matches_per_group_torch_std() -> None:
    gen = torch.Generator().manual_seed(0)
    rewards = torch.rand(40, generator=gen, dtype=torch.float64)
    groups = torch.randint(-5, 5, (40,), generator=gen)
    expected = torch.zeros_like(rewards)
    for g in groups.unique():
        idx = groups == g
        r = rewards[idx]
        if r.numel() > 1:
            expected[idx] = (r - r.mean()) / (r.std() + EPS)
    assert_close(grpo(rewards, groups), expected)


def test_rloo_hand_values() -> None:
    # Group 7: 1 - (0+2)/2 = 0, 0 - (1+2)/2 = -1.5, 2 - (1+0)/2 = 1.5; group -3: 2 - 4, 4 - 2; singleton 0.
    expected = torch.tensor([0.0, -2.0, -1.5, 0.0, 2.0, 1.5], dtype=torch.float64)
    assert_close(rloo(UNSORTED_REWARDS, UNSORTED_GROUPS), expected)


def test_registry_uniform_signature() -> None:
    assert set(ADVANTAGE_ESTIMATORS) == {"grpo", "drgrpo", "grpo_batch_std", "rloo", "passk", "pkpo"}
    for name in ADVANTAGE_ESTIMATORS:
        adv = get_advantage_estimator(name, k=1)(UNSORTED_REWARDS, UNSORTED_GROUPS)  # a group of one here
        assert adv.shape == UNSORTED_REWARDS.shape
    assert_close(
        get_advantage_estimator("grpo")(UNSORTED_REWARDS, UNSORTED_GROUPS),
        grpo(UNSORTED_REWARDS, UNSORTED_GROUPS),
    )


def test_registry_bad_name_lists_valid() -> None:
    with pytest.raises(ValueError, match=r"'gae'.*drgrpo.*grpo.*rloo"):
        get_advantage_estimator("gae")


def test_shape_mismatch_raises() -> None:
    with pytest.raises(ValueError, match="group_ids"):
        grpo(torch.zeros(3), torch.zeros(4, dtype=torch.int64))
