"""Outcome-level advantage estimators: one scalar reward per sequence in, one advantage per sequence out.

Every estimator has the uniform signature ``fn(rewards, group_ids) -> advantages`` with rewards (B,) float
and group_ids (B,) int64; samples sharing a group id answered the same prompt. Group ids may be any integers,
in any order, so a trainer can shuffle or filter a batch without renumbering. Variants with hyperparameters
are registered as ``functools.partial`` objects, so the trainer picks one by name once at start-up.

Group statistics are computed in float64, and a group whose rewards are all equal gets exactly 0.0: in float32
a group of -0.9s has a mean that is not exactly -0.9, and that rounding noise divided by a ~1e-8 std became
advantages of about +-0.06 (or worse) for a group that carries no signal at all.

Not here: token-level estimators that need a value model (GAE), and reward shaping; those get their own
modules.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch

AdvantageEstimator = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _group_inverse(rewards: torch.Tensor, group_ids: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(B,) index of each sample's group in [0, num_groups), and num_groups."""
    if rewards.dim() != 1 or group_ids.shape != rewards.shape:
        shapes = f"{tuple(rewards.shape)} and {tuple(group_ids.shape)}"
        raise ValueError(f"rewards and group_ids must both be (B,), got {shapes}")
    _, inverse = torch.unique(group_ids, return_inverse=True)  # (B,) in [0, num_groups)
    return inverse, int(inverse.max().item()) + 1 if inverse.numel() else 0


def _group_stats(
    rewards: torch.Tensor, group_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-sample group size, group sum, group sum of squared deviations (float64) and "all rewards of the group
    are equal" (bool), each (B,).

    Uses unique + inverse + index_add so any grouping works without a Python loop over groups.
    """
    inverse, num_groups = _group_inverse(rewards, group_ids)
    r = rewards.to(torch.float64)
    counts = torch.zeros(num_groups, dtype=torch.float64, device=r.device).index_add_(
        0, inverse, torch.ones_like(r)
    )
    sums = torch.zeros(num_groups, dtype=torch.float64, device=r.device).index_add_(0, inverse, r)
    mean = (sums / counts)[inverse]  # (B,)
    sq_dev = torch.zeros(num_groups, dtype=torch.float64, device=r.device).index_add_(
        0, inverse, (r - mean) ** 2
    )
    equal = equal_reward_groups(rewards, group_ids)[inverse]
    return counts[inverse], sums[inverse], sq_dev[inverse], equal


def equal_reward_groups(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """(num_groups,) bool: True where every reward of the group is the same (no learning signal there)."""
    inverse, num_groups = _group_inverse(rewards, group_ids)
    r = rewards.to(torch.float64)
    lo = torch.full((num_groups,), float("inf"), dtype=torch.float64, device=r.device)
    hi = torch.full((num_groups,), float("-inf"), dtype=torch.float64, device=r.device)
    return lo.scatter_reduce(0, inverse, r, reduce="amin") == hi.scatter_reduce(0, inverse, r, reduce="amax")


def grpo(
    rewards: torch.Tensor, group_ids: torch.Tensor, *, normalize_std: bool = True, eps: float = 1e-6
) -> torch.Tensor:
    """GRPO advantage (r - group mean) / (group std + eps), as verl's GRPO outcome advantage.

    rewards: (B,) float; group_ids: (B,) int. Returns (B,).
    The std is the unbiased one (correction=1, torch.std's default), as in verl. A group of a single sample
    has no baseline to compare against, so its advantage is defined as exactly 0.0 (verl sets mean 0 and
    std 1 there, which passes the raw reward through; we prefer "no signal" over an unbaselined reward).
    ``normalize_std=False`` subtracts the mean only: Dr. GRPO, which argues the std division over-weights
    near-uniform groups.
    """
    count, total, sq_dev, equal = _group_stats(rewards, group_ids)  # (B,) each, float64
    adv = rewards.to(torch.float64) - total / count
    if normalize_std:
        std = torch.sqrt(sq_dev / (count - 1).clamp(min=1))  # unbiased; clamp only guards the size-1 case
        adv = adv / (std + eps)
    signal = (count > 1) & ~equal
    return torch.where(signal, adv, torch.zeros_like(adv)).to(rewards.dtype)


def rloo(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """REINFORCE leave-one-out: r_i minus the mean reward of the other samples in its group.

    rewards: (B,) float; group_ids: (B,) int. Returns (B,). A group of one has no "others": advantage 0.0.
    Equals n/(n-1) times the mean-centred reward, an unbiased baseline because it excludes r_i itself.
    """
    count, total, _, equal = _group_stats(rewards, group_ids)  # (B,) each, float64
    r = rewards.to(torch.float64)
    adv = r - (total - r) / (count - 1).clamp(min=1)
    signal = (count > 1) & ~equal
    return torch.where(signal, adv, torch.zeros_like(adv)).to(rewards.dtype)


ADVANTAGE_ESTIMATORS: dict[str, AdvantageEstimator] = {
    "grpo": grpo,
    "drgrpo": partial(grpo, normalize_std=False),
    "rloo": rloo,
}


def get_advantage_estimator(name: str) -> AdvantageEstimator:
    """Look up an estimator by name; a bad name raises and lists the valid ones."""
    try:
        return ADVANTAGE_ESTIMATORS[name]
    except KeyError:
        raise ValueError(
            f"unknown advantage estimator {name!r}; valid: {sorted(ADVANTAGE_ESTIMATORS)}"
        ) from None
