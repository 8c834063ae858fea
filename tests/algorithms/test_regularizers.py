"""KL estimators and entropy against hand values."""

import math

import pytest
import torch
from torch.testing import assert_close

from tirl.algorithms.regularizers import entropy_from_logits, kl_penalty

F64 = torch.float64


def test_k1_and_k3_hand_values() -> None:
    logp = torch.tensor([[-1.0, -2.0, -3.0]], dtype=F64)
    ref = torch.tensor([[-1.5, -1.0, 2.0]], dtype=F64)
    assert_close(kl_penalty(logp, ref, estimator="k1"), torch.tensor([[0.5, -1.0, -5.0]], dtype=F64))
    # d = ref - logp = -0.5, 1, 5: e^-0.5 + 0.5 - 1, e - 1 - 1, e^5 - 6 = 142.4 clamped to 10
    expected = torch.tensor([[math.exp(-0.5) - 0.5, math.e - 2.0, 10.0]], dtype=F64)
    assert_close(kl_penalty(logp, ref), expected)
    assert_close(kl_penalty(logp, ref, estimator="k3"), expected)


def test_k3_is_non_negative_and_zero_on_policy() -> None:
    gen = torch.Generator().manual_seed(0)
    logp = -torch.rand(4, 50, generator=gen, dtype=F64) * 5
    ref = -torch.rand(4, 50, generator=gen, dtype=F64) * 5
    assert (kl_penalty(logp, ref) >= 0).all()
    assert_close(kl_penalty(logp, logp), torch.zeros_like(logp))


@pytest.mark.parametrize("estimator", ["k1", "k3"])
def test_estimators_are_unbiased_for_kl(estimator: str) -> None:
    # Exact expectation over x ~ pi of the per-token estimate equals KL(pi || ref) (k3 clamp does not bite).
    logp = torch.log(torch.tensor([0.5, 0.3, 0.2], dtype=F64))
    ref = torch.log(torch.tensor([0.2, 0.2, 0.6], dtype=F64))
    kl = (logp.exp() * (logp - ref)).sum()
    estimate = (logp.exp() * kl_penalty(logp[None], ref[None], estimator=estimator)[0]).sum()
    assert_close(estimate, kl)


def test_unknown_estimator_lists_valid() -> None:
    with pytest.raises(ValueError, match=r"'k2'.*k1.*k3"):
        kl_penalty(torch.zeros(1, 1), torch.zeros(1, 1), estimator="k2")


def test_entropy_uniform_is_log_v() -> None:
    logits = torch.full((2, 3, 7), 4.0)  # (B, T, V)
    assert_close(entropy_from_logits(logits), torch.full((2, 3), math.log(7)))


def test_entropy_hand_value_and_large_logits() -> None:
    # p = (1/2, 1/4, 1/4): H = 0.5 ln 2 + 0.5 ln 4 = 1.5 ln 2; shifting logits by 1000 must not overflow.
    logits = torch.log(torch.tensor([[[0.5, 0.25, 0.25]]], dtype=F64))
    assert_close(entropy_from_logits(logits), torch.tensor([[1.5 * math.log(2)]], dtype=F64))
    assert_close(entropy_from_logits(logits + 1000.0), torch.tensor([[1.5 * math.log(2)]], dtype=F64))


def test_entropy_near_one_hot_is_zero_and_masked_vocab_is_finite() -> None:
    assert_close(entropy_from_logits(torch.tensor([[[100.0, 0.0, 0.0, 0.0]]])), torch.zeros(1, 1))
    logits = torch.tensor([[[0.0, 0.0, -math.inf]]], requires_grad=True)
    entropy = entropy_from_logits(logits)
    entropy.sum().backward()
    assert_close(entropy.detach(), torch.tensor([[math.log(2)]]))
    assert torch.isfinite(logits.grad).all()
