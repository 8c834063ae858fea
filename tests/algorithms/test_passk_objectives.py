"""Pass@k objectives and reward scaling, each checked against brute force over the k-subsets of a group."""

from itertools import combinations
from math import comb

import pytest
import torch

from tirl.algorithms.advantages import (
    get_advantage_estimator,
    grpo_batch_std,
    passk_analytic,
    pkpo,
    pkpo_rewards,
)

F64 = torch.float64


def brute_passk_advantage(rewards: list[float], k: int) -> list[float]:
    """Chen et al.'s bootstrap form: each k-subset scores its best member (success = reward > 0); the subset's
    advantage is (score - mean) / population std over all subsets; a sample's advantage is the mean over the
    subsets that contain it."""
    n = len(rewards)
    subsets = list(combinations(range(n), k))
    score = {s: float(any(rewards[i] > 0 for i in s)) for s in subsets}
    mean = sum(score.values()) / len(subsets)
    std = (sum((v - mean) ** 2 for v in score.values()) / len(subsets)) ** 0.5
    if std == 0:
        return [0.0] * n
    return [sum((score[s] - mean) / std for s in subsets if i in s) / comb(n - 1, k - 1) for i in range(n)]


def brute_pkpo(rewards: list[float], k: int) -> list[float]:
    n = len(rewards)
    return [
        sum(max(rewards[j] for j in s) for s in combinations(range(n), k) if i in s) / comb(n, k)
        for i in range(n)
    ]


@pytest.mark.parametrize("k", [1, 2, 3, 5])
@pytest.mark.parametrize(
    "rewards",
    [[1.0, -1.0, -1.0, -1.0, -1.0, -1.0], [1.0, 1.0, -1.0, -0.6, -1.1, 0.5], [-1.0] * 6, [1.0] * 6],
)
def test_passk_analytic_equals_subset_enumeration(rewards, k):
    adv = passk_analytic(torch.tensor(rewards, dtype=F64), torch.zeros(6, dtype=torch.long), k=k, eps=0.0)
    torch.testing.assert_close(adv, torch.tensor(brute_passk_advantage(rewards, k), dtype=F64))


def test_passk_analytic_k1_is_grpo_with_population_std():
    r = torch.tensor([1.0, -1.0, -1.0, 1.0, -1.0], dtype=F64)
    adv = passk_analytic(r, torch.zeros(5, dtype=torch.long), k=1, eps=0.0)
    success = (r > 0).to(F64)
    torch.testing.assert_close(adv, (success - success.mean()) / success.std(correction=0))


def test_passk_hand_values_and_groups():
    # N = 4, one success, k = 2: R = 1 - C(3,2)/C(4,2) = 1/2, sigma = 1/2; A_pos = 1, A_neg = (1/2 - C(2,1)/C(3,1))/(1/2)
    r = torch.tensor([1.0, -1.0, -1.0, -1.0, 1.0, 1.0, 1.0, 1.0])
    adv = passk_analytic(r, torch.tensor([3, 3, 3, 3, 8, 8, 8, 8]), k=2, eps=0.0)
    torch.testing.assert_close(adv, torch.tensor([1.0, -1 / 3, -1 / 3, -1 / 3, 0.0, 0.0, 0.0, 0.0]))
    with pytest.raises(ValueError, match="k=3 needs groups of at least 3 samples"):
        passk_analytic(r[:2], torch.zeros(2, dtype=torch.long), k=3)


@pytest.mark.parametrize("k", [1, 2, 3, 4, 6])
def test_pkpo_transform_equals_subset_enumeration(k):
    rewards = [0.3, -1.0, 1.0, 0.3, -0.6, 0.9]  # ties and negatives included
    ours = pkpo_rewards(torch.tensor(rewards, dtype=F64), torch.zeros(6, dtype=torch.long), k=k)
    torch.testing.assert_close(ours, torch.tensor(brute_pkpo(rewards, k), dtype=F64))
    # Unbiased: the mean of s over the group, times n/k, is the unbiased max@k estimate of the group.
    est = sum(max(rewards[j] for j in s) for s in combinations(range(6), k)) / comb(6, k)
    torch.testing.assert_close(ours.sum() / k, torch.tensor(est, dtype=F64))


def test_pkpo_k1_is_dr_grpo_and_groups_are_independent():
    r = torch.tensor([1.0, -1.0, 0.5, 2.0, 2.0, -3.0])
    g = torch.tensor([1, 1, 1, 0, 0, 0])
    torch.testing.assert_close(pkpo(r, g, k=1), get_advantage_estimator("drgrpo")(r, g))
    s = pkpo_rewards(r, g, k=2)
    torch.testing.assert_close(s[:3], pkpo_rewards(r[:3], g[:3], k=2))


def test_batch_std_scaling_by_hand():
    r = torch.tensor([1.0, -1.0, 3.0, 3.0])  # group 0 centred: +1, -1; group 1 has no signal: 0, 0
    adv = grpo_batch_std(r, torch.tensor([0, 0, 1, 1]), eps=0.0)
    std = torch.tensor([1.0, -1.0, 0.0, 0.0]).std()
    torch.testing.assert_close(adv, torch.tensor([1.0, -1.0, 0.0, 0.0]) / std)
