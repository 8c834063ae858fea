"""PPO policy loss and aggregation against hand-computed values (clip_low 0.2, clip_high 0.28, clip_c 10)."""

import math

import pytest
import torch
from torch.testing import assert_close

from tirl.algorithms.losses import AGGREGATIONS, aggregate, get_policy_loss, policy_loss

F64 = torch.float64

# (advantage, ratio, expected per-token loss, gradient of that loss w.r.t. logp)
CASES = [
    (1.0, math.exp(0.5), -1.28, 0.0),  # A > 0, ratio 1.65 above 1.28: clipped high, flat
    (-1.0, math.exp(-0.5), 0.8, 0.0),  # A < 0, ratio 0.61 below 0.8: clipped low, flat
    (-1.0, 20.0, 10.0, 0.0),  # A < 0, ratio 20: unclipped term 20 capped by dual clip at clip_c = 10
    (1.0, 0.5, -0.5, -0.5),  # A > 0, ratio below 0.8: clipping does not bite, gradient -A * ratio
    (-1.0, 1.1, 1.1, 1.1),  # A < 0, ratio inside the band: unclipped
    (2.0, 1.0, -2.0, -2.0),  # on-policy: loss -A
]


def _tokens(
    cases: list[tuple[float, float, float, float]],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One sequence (B=1) whose tokens are the cases: logp, old_logp, advantages, each (1, N)."""
    old = torch.full((1, len(cases)), -1.0, dtype=F64)
    logp = old + torch.tensor([[math.log(c[1]) for c in cases]], dtype=F64)
    adv = torch.tensor([[c[0] for c in cases]], dtype=F64)
    return logp, old, adv


@pytest.mark.parametrize("case", CASES)
def test_single_token_hand_values(case: tuple[float, float, float, float]) -> None:
    logp, old, adv = _tokens([case])
    loss, _ = policy_loss(logp, old, adv, torch.ones(1, 1))
    assert_close(loss, torch.tensor(case[2], dtype=F64))


def test_batch_value_and_stats() -> None:
    logp, old, adv = _tokens(CASES)
    loss, stats = policy_loss(logp, old, adv, torch.ones(1, 6, dtype=torch.bool))
    # (-1.28 + 0.8 + 10 - 0.5 + 1.1 - 2) / 6 = 8.12 / 6
    assert_close(loss, torch.tensor(8.12 / 6, dtype=F64))
    ratios = [c[1] for c in CASES]
    expected = {
        "loss/pg": 8.12 / 6,
        "loss/clipfrac": 2 / 6,  # cases 1 and 2
        "loss/clipfrac_low": 1 / 6,  # case 2
        "loss/clipfrac_high": 1 / 6,  # case 1
        "loss/dualclip_frac": 1 / 3,  # case 3 among the three A < 0 tokens
        "loss/ratio_mean": sum(ratios) / 6,
        "loss/approx_kl": -sum(math.log(r) for r in ratios) / 6,
    }
    assert set(stats) == set(expected)
    for key, value in expected.items():
        assert isinstance(stats[key], float)
        assert_close(stats[key], value, msg=key)


def test_gradient_zero_when_clipped_and_minus_a_ratio_otherwise() -> None:
    logp, old, adv = _tokens(CASES)
    logp.requires_grad_(True)
    loss, _ = policy_loss(logp, old, adv, torch.ones(1, 6))
    loss.backward()
    # token-mean divides by the 6 tokens
    assert_close(logp.grad * 6, torch.tensor([[c[3] for c in CASES]], dtype=F64))


def test_zero_advantage_counts_as_no_clipping() -> None:
    # A = 0 with ratio far outside the band: both terms are 0, so no side of the clip bites.
    logp, old, adv = _tokens([(0.0, math.exp(0.5), 0.0, 0.0), (0.0, math.exp(-0.5), 0.0, 0.0)])
    loss, stats = policy_loss(logp, old, adv, torch.ones(1, 2))
    assert_close(loss, torch.tensor(0.0, dtype=F64))
    assert stats["loss/clipfrac"] == stats["loss/clipfrac_low"] == stats["loss/clipfrac_high"] == 0.0


# Per-token losses [[-1.28, 0.8, 10], [-0.5, 1.1, -2]] under mask [[1, 1, 0], [1, 1, 1]].
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])


@pytest.mark.parametrize(
    ("agg", "norm_len", "expected"),
    [
        ("token-mean", None, (-1.28 + 0.8 - 0.5 + 1.1 - 2) / 5),  # -0.376
        ("seq-mean-token-mean", None, ((-1.28 + 0.8) / 2 + (-0.5 + 1.1 - 2) / 3) / 2),  # (-0.24 - 0.4667) / 2
        ("seq-mean-token-sum-norm", None, (-1.28 + 0.8 - 0.5 + 1.1 - 2) / (2 * 3)),  # B = 2, T = 3
        ("seq-mean-token-sum-norm", 4, (-1.28 + 0.8 - 0.5 + 1.1 - 2) / (2 * 4)),
    ],
)
def test_policy_loss_aggregations(agg: str, norm_len: int | None, expected: float) -> None:
    logp, old, adv = _tokens(CASES)
    loss, stats = policy_loss(
        logp.view(2, 3), old.view(2, 3), adv.view(2, 3), MASK, agg=agg, norm_len=norm_len
    )
    assert_close(loss, torch.tensor(expected, dtype=F64))
    assert_close(stats["loss/pg"], expected)
    assert_close(stats["loss/clipfrac"], 2 / 5)
    assert_close(stats["loss/dualclip_frac"], 0.0)  # the dual-clipped token is masked out


@pytest.mark.parametrize(
    ("agg", "norm_len", "expected"),
    [
        ("token-mean", None, (1 + 2 + 4) / 3),
        ("seq-mean-token-mean", None, (1.5 + 4) / 2),  # the empty third row is skipped
        # the empty third row is skipped here too, as verl's agg_loss does (tests/algorithms/test_verl_parity.py)
        ("seq-mean-token-sum-norm", None, (3 + 4) / (2 * 3)),
        ("seq-mean-token-sum-norm", 5, (3 + 4) / (2 * 5)),
    ],
)
def test_aggregate_uneven_masks(agg: str, norm_len: int | None, expected: float) -> None:
    values = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [math.inf, 8.0, 9.0]], dtype=F64)  # (B=3, T=3)
    mask = torch.tensor([[True, True, False], [True, False, False], [False, False, False]])
    assert_close(aggregate(values, mask, agg, norm_len=norm_len), torch.tensor(expected, dtype=F64))


def test_sequence_and_token_advantages_agree() -> None:
    gen = torch.Generator().manual_seed(0)
    logp = -torch.rand(3, 5, generator=gen, dtype=F64) * 2
    old = -torch.rand(3, 5, generator=gen, dtype=F64) * 2
    adv = torch.tensor([1.5, -0.7, 0.2], dtype=F64)
    mask = torch.rand(3, 5, generator=gen) > 0.3
    for agg in AGGREGATIONS:
        seq_loss, seq_stats = policy_loss(logp, old, adv, mask, agg=agg)
        tok_loss, tok_stats = policy_loss(logp, old, adv[:, None].expand(3, 5), mask, agg=agg)
        assert_close(seq_loss, tok_loss)
        assert seq_stats == tok_stats


@pytest.mark.parametrize("agg", sorted(AGGREGATIONS))
def test_empty_mask_gives_zero_without_nan(agg: str) -> None:
    logp, old, adv = _tokens(CASES)
    logp.requires_grad_(True)
    loss, stats = policy_loss(logp, old, adv, torch.zeros(1, 6), agg=agg)
    loss.backward()
    assert loss.item() == 0.0
    assert loss.requires_grad
    assert_close(logp.grad, torch.zeros_like(logp))
    assert all(v == 0.0 for v in stats.values())


def test_bad_agg_lists_valid() -> None:
    with pytest.raises(ValueError, match=r"'sum'.*seq-mean-token-mean.*token-mean"):
        aggregate(torch.zeros(1, 1), torch.ones(1, 1), "sum")


def test_clip_c_must_exceed_one() -> None:
    logp, old, adv = _tokens(CASES)
    with pytest.raises(ValueError, match="clip_c"):
        policy_loss(logp, old, adv, torch.ones(1, 6), clip_c=1.0)


def test_registry() -> None:
    assert get_policy_loss("ppo") is policy_loss
    with pytest.raises(ValueError, match=r"'grpo'.*ppo"):
        get_policy_loss("grpo")
