"""Mismatch metrics, token TIS and sequence MIS against hand-computed values; the advantage-scaling identity."""

import math

import pytest
import torch
from torch.testing import assert_close

from tirl.algorithms.losses import policy_loss
from tirl.algorithms.rollout_correction import (
    correction_weights,
    mismatch_metrics,
    seq_mis_weights,
    token_tis_weights,
)

F64 = torch.float64
# two sequences, three positions; the last position of sequence 1 is padding (mask 0)
ROLLOUT = torch.tensor([[-1.0, -2.0, -0.5], [-1.0, -1.0, -3.0]], dtype=F64)
DELTA = torch.tensor([[0.1, -0.3, 1.0], [0.5, 0.8, 7.0]], dtype=F64)  # log pi_old - log pi_rollout
OLD = ROLLOUT + DELTA
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]], dtype=F64)


def test_mismatch_metrics():
    m = mismatch_metrics(OLD, ROLLOUT, MASK)
    d = [0.1, -0.3, 1.0, 0.5, 0.8]  # the padded 7.0 is ignored
    assert m["rollout/logprob_diff_mean"] == pytest.approx(sum(abs(x) for x in d) / 5)  # 0.54
    assert m["rollout/logprob_diff_max"] == pytest.approx(1.0)
    assert m["rollout/kl_k3"] == pytest.approx(sum(math.exp(x) - x - 1 for x in d) / 5)
    same = mismatch_metrics(ROLLOUT, ROLLOUT, MASK)
    assert same == {"rollout/logprob_diff_mean": 0.0, "rollout/logprob_diff_max": 0.0, "rollout/kl_k3": 0.0}


def test_token_tis_caps_each_ratio():
    w = token_tis_weights(OLD, ROLLOUT, MASK, cap=2.0)
    # exp(0.1)=1.105, exp(-0.3)=0.741, exp(1)=2.718->2, exp(0.5)=1.649, exp(0.8)=2.226->2, padding 0
    expected = torch.tensor([[math.exp(0.1), math.exp(-0.3), 2.0], [math.exp(0.5), 2.0, 0.0]], dtype=F64)
    assert_close(w, expected)
    _, stats = correction_weights("token_tis", OLD, ROLLOUT, MASK, cap=2.0)
    assert stats["rollout_corr/capped_frac"] == pytest.approx(2 / 5)


def test_seq_mis_masks_sequences_out_of_bounds():
    # sequence 0: rho = exp(0.1 - 0.3 + 1.0) = exp(0.8) = 2.226 (kept); sequence 1: exp(1.3) = 3.669 > 3 (masked)
    w = seq_mis_weights(OLD, ROLLOUT, MASK, low=0.0, high=3.0)
    assert_close(w, torch.tensor([[math.exp(0.8)] * 3, [0.0, 0.0, 0.0]], dtype=F64))
    w = seq_mis_weights(OLD, ROLLOUT, MASK, low=2.5, high=4.0)  # now sequence 0 is below the lower bound
    assert_close(w, torch.tensor([[0.0] * 3, [math.exp(1.3), math.exp(1.3), 0.0]], dtype=F64))
    _, stats = correction_weights("seq_mis", OLD, ROLLOUT, MASK, high=3.0)
    assert stats["rollout_corr/masked_seq_frac"] == 0.5


def test_none_and_bad_input():
    assert correction_weights("none", OLD, ROLLOUT, MASK) == (None, {})
    with pytest.raises(ValueError, match="unknown rollout correction"):
        correction_weights("tis", OLD, ROLLOUT, MASK)
    with pytest.raises(ValueError, match="bounds"):
        seq_mis_weights(OLD, ROLLOUT, MASK, low=3.0, high=2.0)


def test_weighting_the_advantage_weights_the_per_token_loss():
    """The PPO/dual-clip surrogate is positively homogeneous in A (loss(wA) = w loss(A), w >= 0), so scaling the
    advantages by the detached weight is the same as weighting each token's loss: the trainer relies on this."""
    g = torch.Generator().manual_seed(0)
    logp = torch.randn(2, 3, generator=g, dtype=F64) - 1
    old = logp + torch.randn(2, 3, generator=g, dtype=F64)  # ratios far outside the clip band too
    adv = torch.tensor([[1.5, -2.0, 0.7], [-0.4, 3.0, -1.0]], dtype=F64)
    w = token_tis_weights(OLD, ROLLOUT, MASK, cap=2.0)
    per_token = lambda a: torch.stack(  # noqa: E731 - one token at a time, unaggregated
        [
            policy_loss(logp[b : b + 1, t : t + 1], old[b : b + 1, t : t + 1], a[b : b + 1, t : t + 1],
                        torch.ones(1, 1, dtype=F64))[0]
            for b in range(2) for t in range(3)
        ]
    ).view(2, 3)  # fmt: skip
    assert_close(per_token(adv * w), per_token(adv) * w)
