"""Outcome-level advantage estimators: one scalar reward per sequence in, one advantage per sequence out.

Every estimator has the uniform signature ``fn(rewards, group_ids, *, <hyperparameters>) -> advantages`` with
rewards (B,) float and group_ids (B,) int64; samples sharing a group id answered the same prompt. Group ids may be
any integers, in any order, so a trainer can shuffle or filter a batch without renumbering. `register_advantage`
adds one (from any module, before a run starts; variants as ``functools.partial`` objects), with the check of its
hyperparameters against the group size and the dataclass of its ``rl.advantage.*`` settings next to it, so the trainer picks one by name once at start-up and never
asks which one it is.

Group statistics are computed in float64, and a group whose rewards are all equal gets exactly 0.0: in float32
a group of -0.9s has a mean that is not exactly -0.9, and that rounding noise divided by a ~1e-8 std became
advantages of about +-0.06 (or worse) for a group that carries no signal at all.

Not here: token-level estimators that need a value model (GAE), and reward shaping; those get their own
modules.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from functools import partial
from math import comb
from typing import Any, ClassVar

import torch

from .registry import Registry, check_signature

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


def grpo_batch_std(rewards: torch.Tensor, group_ids: torch.Tensor, *, eps: float = 1e-6) -> torch.Tensor:
    """Group-mean baseline, batch std scale (reward scaling "by batch", as REINFORCE++-baseline and LitePPO).

    rewards: (B,) float; group_ids: (B,) int. Returns (B,). Groups with no signal stay exactly 0.
    """
    adv = grpo(rewards, group_ids, normalize_std=False).to(torch.float64)  # (B,)
    std = adv.std() if adv.numel() > 1 else adv.new_tensor(0.0)
    return (adv / (std + eps)).to(rewards.dtype)


def _groups_of_at_least(group_ids: torch.Tensor, k: int, what: str) -> list[torch.Tensor]:
    """Indices of each group's members, one (G,) tensor per group; every group must hold at least k >= 1."""
    if k < 1:
        raise ValueError(f"{what} needs k >= 1, got {k}")
    _, inverse = torch.unique(group_ids, return_inverse=True)
    groups = (
        [torch.nonzero(inverse == g).squeeze(-1) for g in range(int(inverse.max()) + 1)]
        if inverse.numel()
        else []
    )
    for idx in groups:
        if idx.numel() < k:
            raise ValueError(
                f"{what} with k={k} needs groups of at least {k} samples, got {idx.numel()} (raise rl.n)"
            )
    return groups


def passk_analytic(
    rewards: torch.Tensor, group_ids: torch.Tensor, *, k: int, eps: float = 1e-6
) -> torch.Tensor:
    """Analytic pass@k advantage of "Pass@k Training" (Chen et al. 2025, arXiv 2508.10751).

    rewards: (B,) float, a sample succeeds when its reward is > 0; group_ids: (B,) int. Returns (B,).
    A group of N with N_neg failures has pass@k R = 1 - C(N_neg, k)/C(N, k) and sigma = sqrt(R(1 - R)); a success
    gets (1 - R)/sigma, a failure (1 - R - C(N_neg - 1, k - 1)/C(N - 1, k - 1))/sigma. That is the GRPO advantage of
    every k-subset (scored by its best member), averaged over the subsets containing the sample: failures that
    share subsets with successes are penalised less, which keeps exploring. Not verl's `grpo_passk` (arXiv
    2503.19595: only the best sample gets r_max - r_second_max). Groups smaller than k are an error.
    """
    adv = torch.zeros(rewards.shape, dtype=torch.float64, device=rewards.device)
    for idx in _groups_of_at_least(group_ids, k, "the pass@k advantage"):
        n = idx.numel()
        success = rewards[idx] > 0  # (G,)
        n_neg = int((~success).sum())
        r_bar = 1.0 - comb(n_neg, k) / comb(n, k)
        sigma = (r_bar * (1.0 - r_bar)) ** 0.5
        if sigma == 0.0:  # all succeed or all fail: no signal
            continue
        a_pos = (1.0 - r_bar) / (sigma + eps)
        a_neg = (1.0 - r_bar - comb(n_neg - 1, k - 1) / comb(n - 1, k - 1)) / (sigma + eps)
        adv[idx] = torch.where(
            success, torch.tensor(a_pos, dtype=torch.float64), torch.tensor(a_neg, dtype=torch.float64)
        )
    return adv.to(rewards.dtype)


def pkpo_rewards(rewards: torch.Tensor, group_ids: torch.Tensor, *, k: int) -> torch.Tensor:
    """PKPO's unbiased pass@k (max@k) reward transformation (Walder & Karkhanis 2025, arXiv 2505.15201).

    rewards: (B,) float, any values; group_ids: (B,) int. Returns (B,) transformed rewards s.
    s_i = (1/C(n, k)) * sum over the k-subsets S of the group that contain i of max(S): then sum_i s_i * grad log p_i
    is an unbiased estimate of the gradient of max@k (pass@k for 0/1 rewards). Closed form over the sorted group:
    the subsets containing the i-th smallest have their max at i itself (C(i-1, k-1) of them) or at a larger m
    (C(m-2, k-2) of them each).
    """
    out = torch.zeros(rewards.shape, dtype=torch.float64, device=rewards.device)
    for idx in _groups_of_at_least(group_ids, k, "PKPO"):
        n = idx.numel()
        r, order = torch.sort(rewards[idx].to(torch.float64))  # ascending
        total = comb(n, k)
        s = torch.empty(n, dtype=torch.float64)
        for i in range(1, n + 1):  # 1-based rank
            own = comb(i - 1, k - 1) * float(r[i - 1])
            above = sum(comb(m - 2, k - 2) * float(r[m - 1]) for m in range(i + 1, n + 1)) if k >= 2 else 0.0
            s[i - 1] = (own + above) / total
        out[idx[order]] = s
    return out.to(rewards.dtype)


def pkpo(rewards: torch.Tensor, group_ids: torch.Tensor, *, k: int) -> torch.Tensor:
    """PKPO advantage: the transformed rewards scaled by n/k (so that their group mean is the group's unbiased
    max@k estimate and k = 1 gives back the raw rewards), centred on that mean (Dr. GRPO's baseline, which lowers
    the variance; the paper's leave-one-out baselines are not reproduced). rewards, group_ids: (B,). Returns (B,)."""
    _, inverse = torch.unique(group_ids, return_inverse=True)
    sizes = torch.bincount(inverse).to(torch.float64)[inverse]  # (B,) n of each sample's group
    s = pkpo_rewards(rewards, group_ids, k=k).to(torch.float64) * sizes / k
    return grpo(s, group_ids, normalize_std=False).to(rewards.dtype)


def k_within_group(*, group_size: int, k: int) -> None:
    """The pass@k estimators score subsets of k samples of one group: 1 <= k <= group size."""
    if not 1 <= k <= group_size:
        raise ValueError(
            f"k={k} must be in [1, the group size {group_size}]: pass@k scores k samples of one group"
        )


@dataclass
class AdvantageOptions:
    """`rl.advantage.*`: the estimator by name and, in the subclass registered with it, its own hyperparameters with
    their defaults (`PassKOptions`: k). The config loader builds the subclass `name` names (`VARIANT_KEY`, as
    `task.*`), so `rl.advantage.*` holds only what that estimator reads."""

    VARIANT_KEY: ClassVar[str] = "name"

    name: str = "grpo"  # a registered estimator (register_advantage)

    @classmethod
    def config_variant(cls, value: Any) -> type[AdvantageOptions]:
        """The options dataclass of the estimator named `value` (the config loader's hook)."""
        return ADVANTAGE_ESTIMATORS.lookup(str(value)).options

    def hyperparameters(self) -> dict[str, Any]:
        """The estimator's own keyword hyperparameters: the fields this subclass adds to `AdvantageOptions`."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "name"}


@dataclass
class PassKOptions(AdvantageOptions):
    """The pass@k objectives' k (`passk`, `pkpo`): the subsets of k samples of one group they score."""

    name: str = "passk"
    k: int = 4


@dataclass(frozen=True)
class RegisteredEstimator:
    """An estimator and what the trainer asks about it instead of its name: the keyword hyperparameters it takes,
    `check(group_size=G, **those)`, which raises ValueError when they cannot work with groups of G, and `options`,
    the dataclass of its `rl.advantage.*` settings."""

    fn: Callable[..., torch.Tensor]
    hyperparameters: frozenset[str]
    check: Callable[..., None] | None = None
    check_takes: frozenset[str] = frozenset()  # the keyword parameters of `check`
    options: type[AdvantageOptions] = AdvantageOptions


ADVANTAGE_ESTIMATORS: Registry[RegisteredEstimator] = Registry("advantage estimator")


def register_advantage(
    name: str,
    fn: Callable[..., torch.Tensor],
    *,
    check: Callable[..., None] | None = None,
    options: type[AdvantageOptions] = AdvantageOptions,
    replace: bool = False,
) -> Callable[..., torch.Tensor]:
    """Add `fn(rewards, group_ids, *, <hyperparameters>) -> advantages` under `name`, with an optional `check`
    and `options`, the dataclass of its `rl.advantage.*` settings (an `AdvantageOptions` subclass whose own fields
    are hyperparameters of `fn`, with their defaults; see `RegisteredEstimator`); returns `fn`. A taken name raises
    unless `replace=True`."""
    if not (isinstance(options, type) and issubclass(options, AdvantageOptions)):
        raise ValueError(f"advantage estimator {name!r}: options must be an AdvantageOptions subclass")
    own = tuple(f.name for f in fields(options) if f.name != "name")
    hyper = check_signature(fn, "advantage estimator", name, positional=2, keywords=own)
    takes = frozenset()
    if check is not None:
        takes = check_signature(check, "advantage check", name, positional=0, keywords=("group_size",))
    ADVANTAGE_ESTIMATORS.add(name, RegisteredEstimator(fn, hyper, check, takes, options), replace=replace)
    return fn


def get_advantage_estimator(name: str, **hyper: float) -> AdvantageEstimator:
    """Look up an estimator by name and bind the hyperparameters it takes (e.g. `k` for pass@k); a bad name raises
    and lists the valid ones. Hyperparameters the estimator does not take are ignored."""
    entry = ADVANTAGE_ESTIMATORS.lookup(name)
    bound = {key: v for key, v in hyper.items() if key in entry.hyperparameters}
    return partial(entry.fn, **bound) if bound else entry.fn


def check_advantage(name: str, *, group_size: int, **hyper: float) -> None:
    """Raise ValueError when the estimator `name` cannot work with groups of `group_size` and the hyperparameters
    it takes from `hyper` (its own `check`); a bad name raises and lists the valid ones."""
    entry = ADVANTAGE_ESTIMATORS.lookup(name)
    if entry.check is not None:
        given = {k: v for k, v in hyper.items() if k in entry.hyperparameters and k in entry.check_takes}
        entry.check(group_size=group_size, **given)


register_advantage("grpo", grpo)
register_advantage("drgrpo", partial(grpo, normalize_std=False))
register_advantage("grpo_batch_std", grpo_batch_std)
register_advantage("rloo", rloo)
register_advantage("passk", passk_analytic, check=k_within_group, options=PassKOptions)
register_advantage("pkpo", pkpo, check=k_within_group, options=PassKOptions)


def default_advantage_options() -> AdvantageOptions:
    """The default estimator's options at their defaults (GRPO)."""
    return AdvantageOptions.config_variant(AdvantageOptions.name)()
