"""Policy-gradient losses on per-token log-probabilities, and the token/sequence aggregation they share.

The trainer runs the model and passes tensors in; nothing here reads trainer state or a config object.
Every policy loss has the uniform signature
``fn(logp, old_logp, advantages, loss_mask, *, <its hyperparameters>, agg, norm_len, num_tokens, num_seqs)
-> (loss, stats)`` (the last two: the mini-batch's denominators when the call sees one micro-batch of it),
is added with ``register_policy_loss`` together with the dataclass of its settings (a ``LossOptions`` subclass:
its hyperparameters with their defaults, which the config loader builds as ``rl.loss.*`` when ``rl.loss.name``
names it; the registration checks both) and is picked by name once at start-up via ``get_policy_loss``. A loss
with a new hyperparameter is one function, one options dataclass and one ``register_policy_loss`` call, in one
module. ``aggregate`` is public so entropy or KL terms
reduce over tokens exactly as the policy loss does.

``loss_mask`` is 0/1 (bool or float): 1 on sampled assistant tokens, 0 on prompt, tool-output and padding
tokens. Masked-out positions are zero-filled before any sum, so garbage (even inf) there cannot leak into
the loss.

Not here: value losses, KL/entropy terms (see ``regularizers``), and anything that computes log-probs.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Literal

import torch

from .registry import Registry, check_signature

# Log-ratio clamp before exp, as verl: keeps exp finite. It never changes the loss or its gradient while
# clip_c < e^20, because any ratio that far from 1 is already on a flat (clipped) branch.
_LOG_RATIO_LIMIT = 20.0


def _token_mean(
    values: torch.Tensor, mask: torch.Tensor, norm_len: int | None, num_tokens, num_seqs
) -> torch.Tensor:
    """Every trained token in the mini-batch weighs the same: long answers dominate."""
    denom = mask.sum().clamp(min=1.0) if num_tokens is None else num_tokens
    return values.sum() / denom


def _has_tokens(mask: torch.Tensor) -> torch.Tensor:
    return (mask.sum(dim=-1) > 0).to(mask.dtype)  # (B,)


def _seq_mean_token_mean(
    values: torch.Tensor, mask: torch.Tensor, norm_len: int | None, num_tokens, num_seqs
) -> torch.Tensor:
    """Every sequence weighs the same (the original GRPO); sequences with no trained token are skipped."""
    seq_mean = values.sum(dim=-1) / mask.sum(dim=-1).clamp(min=1.0)  # (B,)
    has = _has_tokens(mask)
    denom = has.sum().clamp(min=1.0) if num_seqs is None else num_seqs
    return (seq_mean * has).sum() / denom


def _seq_mean_token_sum_norm(
    values: torch.Tensor, mask: torch.Tensor, norm_len: int | None, num_tokens, num_seqs
) -> torch.Tensor:
    """Dr. GRPO: per-sequence token sum over a constant length, so length does not rescale a token's weight.

    The mean is over sequences with at least one trained token (as verl's `agg_loss`). The constant is
    ``norm_len`` if given, else T (the padded last dim); the trainer always passes its response budget, since a
    constant that depends on the batch brings the length bias back.
    """
    constant = norm_len if norm_len is not None else values.shape[-1]
    denom = _has_tokens(mask).sum().clamp(min=1.0) if num_seqs is None else num_seqs
    return values.sum() / (denom * constant)


AGGREGATIONS: dict[str, Callable[..., torch.Tensor]] = {
    "token-mean": _token_mean,
    "seq-mean-token-mean": _seq_mean_token_mean,
    "seq-mean-token-sum-norm": _seq_mean_token_sum_norm,
}


def aggregate(
    values: torch.Tensor,
    mask: torch.Tensor,
    agg: str,
    *,
    norm_len: int | None = None,
    num_tokens: float | torch.Tensor | None = None,
    num_seqs: float | torch.Tensor | None = None,
) -> torch.Tensor:
    """Reduce per-token values (B, T) under a 0/1 mask (B, T) to a scalar with the named aggregation.

    `num_tokens` (trained tokens) and `num_seqs` (sequences with a trained token) are the denominators of the whole
    mini-batch when `values` is one micro-batch of it (summed over micro-batches and processes); then the sum of
    the micro-batches' aggregates is the mini-batch's aggregate, and so is its gradient, however the batch is split.
    None uses this batch's own counts. An all-zero mask gives 0.0 still connected to ``values``' graph.
    """
    if agg not in AGGREGATIONS:
        raise ValueError(f"unknown aggregation {agg!r}; valid: {sorted(AGGREGATIONS)}")
    if norm_len is not None and norm_len < 1:
        raise ValueError(f"norm_len must be >= 1, got {norm_len}")
    mask_f = mask.to(values.dtype)  # (B, T)
    masked = values.masked_fill(mask_f == 0, 0.0)  # (B, T); zero-fill, not multiply: inf * 0 is NaN
    if num_tokens is not None:
        num_tokens = torch.as_tensor(num_tokens, dtype=values.dtype, device=values.device).clamp(min=1.0)
    if num_seqs is not None:
        num_seqs = torch.as_tensor(num_seqs, dtype=values.dtype, device=values.device).clamp(min=1.0)
    return AGGREGATIONS[agg](masked, mask_f, norm_len, num_tokens, num_seqs)


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    """Mean of x over mask != 0 as a Python float; 0.0 for an empty mask."""
    mask_f = mask.to(torch.float64)
    total = mask_f.sum()
    if total == 0:
        return 0.0
    return float(x.to(torch.float64).masked_fill(mask_f == 0, 0.0).sum() / total)


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    clip_c: float = 10.0,
    agg: str = "token-mean",
    norm_len: int | None = None,
    num_tokens: float | torch.Tensor | None = None,
    num_seqs: float | torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO clipped surrogate with asymmetric clip (DAPO's clip-higher) and dual clip, as verl's vanilla loss.

    logp, old_logp: (B, T) log-probs of the sampled tokens under the current and the behaviour policy.
    advantages: (B, T), or (B,) broadcast over T. loss_mask: (B, T), 0/1.
    Per token: ratio = exp(logp - old_logp);
    pg = max(-A * ratio, -A * clip(ratio, 1 - clip_low, 1 + clip_high)); where A < 0 additionally
    pg = min(pg, -A * clip_c), so one token whose ratio exploded cannot dominate.
    Returns the aggregated loss and flat stats; clipfrac = clipfrac_low + clipfrac_high (both over all mask
    tokens), dualclip_frac is over mask tokens with A < 0.
    """
    if clip_c <= 1.0:
        raise ValueError(f"clip_c must be > 1, got {clip_c}")
    if not 0.0 <= clip_low < 1.0 or clip_high < 0.0:
        raise ValueError(f"need 0 <= clip_low < 1 and clip_high >= 0, got {clip_low}, {clip_high}")
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1)  # (B, 1), broadcasts over T
    advantages = advantages.expand_as(logp)  # (B, T)

    log_ratio = (logp - old_logp).clamp(-_LOG_RATIO_LIMIT, _LOG_RATIO_LIMIT)  # (B, T)
    ratio = torch.exp(log_ratio)  # (B, T)
    pg1 = -advantages * ratio
    pg2 = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    clipped = torch.maximum(pg1, pg2)  # (B, T)
    pg3 = -advantages * clip_c
    negative = advantages < 0
    pg = torch.where(negative, torch.minimum(clipped, pg3), clipped)  # (B, T)
    loss = aggregate(pg, loss_mask, agg, norm_len=norm_len, num_tokens=num_tokens, num_seqs=num_seqs)

    with torch.no_grad():
        mask = loss_mask.to(torch.bool)
        stats = {
            "loss/pg": float(loss.detach()),
            "loss/clipfrac": _masked_mean((pg2 > pg1).float(), mask),
            "loss/clipfrac_low": _masked_mean(((ratio < 1.0 - clip_low) & negative).float(), mask),
            "loss/clipfrac_high": _masked_mean(((ratio > 1.0 + clip_high) & (advantages > 0)).float(), mask),
            "loss/dualclip_frac": _masked_mean((pg3 < clipped).float(), mask & negative),
            "loss/ratio_mean": _masked_mean(ratio, mask),
            "loss/approx_kl": _masked_mean(old_logp - logp, mask),
        }
    return loss, stats


def gspo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    clip_low: float = 3e-4,
    clip_high: float = 4e-4,
    agg: str = "seq-mean-token-mean",
    norm_len: int | None = None,
    num_tokens: float | torch.Tensor | None = None,
    num_seqs: float | torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GSPO (arXiv 2507.18071): one importance ratio per sequence, the geometric mean of its token ratios.

    Shapes as `policy_loss`. s_i = exp(mean over i's trained tokens of (logp - old_logp)); per token the ratio is
    sg(s_i) * pi / sg(pi), so the value is s_i and the gradient flows through each token's log-prob; the PPO clip
    applies to s_i (the paper's ranges are ~1e-4, hence these defaults and `GSPOOptions`'). No dual clip. As verl's
    `compute_policy_loss_gspo`, log s is capped at 10.
    """
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1)
    advantages = advantages.expand_as(logp)  # (B, T)
    mask_f = loss_mask.to(logp.dtype)
    log_ratio = (logp - old_logp).masked_fill(mask_f == 0, 0.0)  # (B, T)
    seq_log_ratio = log_ratio.sum(-1) / mask_f.sum(-1).clamp(min=1.0)  # (B,)
    log_s = (logp - logp.detach() + seq_log_ratio.detach().unsqueeze(-1)).clamp(max=10.0)  # (B, T)
    ratio = torch.exp(log_s)
    pg1 = -advantages * ratio
    pg2 = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = aggregate(
        torch.maximum(pg1, pg2), loss_mask, agg, norm_len=norm_len, num_tokens=num_tokens, num_seqs=num_seqs
    )
    with torch.no_grad():
        mask = loss_mask.to(torch.bool)
        stats = {
            "loss/pg": float(loss.detach()),
            "loss/clipfrac": _masked_mean((pg2 > pg1).float(), mask),
            "loss/ratio_mean": _masked_mean(ratio, mask),
            "loss/approx_kl": _masked_mean(old_logp - logp, mask),
        }
    return loss, stats


def cispo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    agg: str = "token-mean",
    norm_len: int | None = None,
    num_tokens: float | torch.Tensor | None = None,
    num_seqs: float | torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """CISPO (MiniMax-M1, arXiv 2506.13585): REINFORCE weighted by the clipped, detached importance ratio.

    Shapes as `policy_loss`. Per token: -sg(clip(ratio, 1 - clip_low, 1 + clip_high)) * A * logp. Unlike PPO no
    token is dropped from the gradient when its ratio leaves the range; only its weight is capped. Matches verl's `compute_policy_loss_cispo`.
    """
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1)
    advantages = advantages.expand_as(logp)  # (B, T)
    ratio = torch.exp((logp - old_logp).clamp(-_LOG_RATIO_LIMIT, _LOG_RATIO_LIMIT))  # (B, T)
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high).detach()
    loss = aggregate(
        -clipped * advantages * logp,
        loss_mask,
        agg,
        norm_len=norm_len,
        num_tokens=num_tokens,
        num_seqs=num_seqs,
    )
    with torch.no_grad():
        mask = loss_mask.to(torch.bool)
        stats = {
            "loss/pg": float(loss.detach()),
            "loss/clipfrac": _masked_mean((ratio != clipped).float(), mask),
            "loss/ratio_mean": _masked_mean(ratio, mask),
            "loss/approx_kl": _masked_mean(old_logp - logp, mask),
        }
    return loss, stats


PolicyLoss = Callable[..., tuple[torch.Tensor, dict[str, float]]]

# what the trainer passes every policy loss, by keyword, besides the loss's own hyperparameters (its options)
LOSS_KEYWORDS = ("agg", "norm_len", "num_tokens", "num_seqs")
Aggregation = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


def _check_finite(
    name: str, value: float, low: float, high: float | None = None, *, low_open: bool = False
) -> None:
    """Raise unless `value` is finite and in [low, high) (`low_open`: (low, ...)); NaN fails every comparison, so
    `if value < low` alone lets it through. The message reads as `tirl.core.bounds.check_range`'s."""
    above = value > low if low_open else value >= low
    if not (math.isfinite(value) and above and (high is None or value < high)):
        lo = f"{low} {'<' if low_open else '<='} {name}" + ("" if high is None else f" < {high}")
        raise ValueError(f"{name}={value} must be a finite number with {lo}")


@dataclass
class LossOptions:
    """`rl.loss.*`: the policy loss by name and, in the subclass registered with it, its own hyperparameters with
    its own defaults (`PPOOptions`: the recipe's clip range; `GSPOOptions`: the GSPO paper's). The config loader
    builds the subclass `name` names (`VARIANT_KEY`, as `task.*`), so `rl.loss.*` holds only what that loss reads.
    The fields of this base are the aggregation every loss, KL and entropy term shares; a subclass's own fields are
    passed to its function by keyword (`hyperparameters`)."""

    VARIANT_KEY: ClassVar[str] = "name"

    name: str = "ppo"  # a registered policy loss (register_policy_loss)
    agg: Aggregation = "token-mean"
    norm_len: int = 0  # the constant of seq-mean-token-sum-norm; 0 = the response budget (agent)
    # exact: the token mean over the mini-batch; micro: verl's per-micro-batch token-mean (tirl.train.rl.update)
    token_mean: Literal["exact", "micro"] = "exact"

    def __post_init__(self) -> None:
        if not 0 <= self.norm_len <= 1 << 20:  # tirl.core.bounds.MAX_TOKENS, which this layer does not import
            raise ValueError(f"norm_len must be 0-{1 << 20} (0 = the response budget), got {self.norm_len}")

    @classmethod
    def config_variant(cls, value: Any) -> type[LossOptions]:
        """The options dataclass of the loss named `value` (the config loader's hook)."""
        POLICY_LOSSES.lookup(str(value))
        return _LOSS_OPTIONS[str(value)]

    def hyperparameters(self) -> dict[str, Any]:
        """The loss's own keyword hyperparameters: the fields this subclass adds to `LossOptions`."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in _BASE_FIELDS}


_BASE_FIELDS = frozenset(f.name for f in fields(LossOptions))


@dataclass
class ClipOptions(LossOptions):
    """A ratio clipped to [1 - clip_low, 1 + clip_high]: `cispo` (its weight's range), and the base of the others."""

    name: str = "cispo"
    clip_low: float = 0.2
    clip_high: float = 0.28

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_finite("clip_low", self.clip_low, 0, 1)
        _check_finite("clip_high", self.clip_high, 0)


@dataclass
class PPOOptions(ClipOptions):
    """`ppo`: the recipe's clip-higher range (DAPO's 0.2 / 0.28) and dual clip."""

    name: str = "ppo"
    clip_c: float = 10.0  # dual-clip constant (verl's clip_ratio_c)

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_finite("clip_c", self.clip_c, 1, low_open=True)


@dataclass
class GSPOOptions(ClipOptions):
    """`gspo`: the GSPO paper's sequence-ratio range (3e-4 / 4e-4) and its sequence mean (as verl's GSPO recipe:
    clip_ratio_low=0.0003, clip_ratio_high=0.0004, loss_agg_mode=seq-mean-token-mean)."""

    name: str = "gspo"
    agg: Aggregation = "seq-mean-token-mean"
    clip_low: float = 3e-4
    clip_high: float = 4e-4


POLICY_LOSSES: Registry[PolicyLoss] = Registry("policy loss")
_LOSS_OPTIONS: dict[str, type[LossOptions]] = {}


def register_policy_loss(
    name: str, fn: PolicyLoss, *, options: type[LossOptions] = LossOptions, replace: bool = False
) -> PolicyLoss:
    """Add `fn(logp, old_logp, advantages, loss_mask, *, <options' own fields>, <LOSS_KEYWORDS>) -> (loss, stats)`
    under `name`, with `options`, the dataclass of its `rl.loss.*` settings (a `LossOptions` subclass whose own fields
    are `fn`'s hyperparameters, with their defaults); returns `fn`. A taken name raises unless `replace=True`; a
    function or options of another shape raise now, not mid-run."""
    if not (isinstance(options, type) and issubclass(options, LossOptions)):
        raise ValueError(f"policy loss {name!r}: options must be a LossOptions subclass, got {options!r}")
    own = tuple(f.name for f in fields(options) if f.name not in _BASE_FIELDS)
    check_signature(fn, "policy loss", name, positional=4, keywords=(*own, *LOSS_KEYWORDS))
    POLICY_LOSSES.add(name, fn, replace=replace)
    _LOSS_OPTIONS[name] = options
    return fn


def get_policy_loss(name: str) -> PolicyLoss:
    """Look up a policy loss by name; a bad name raises and lists the valid ones."""
    return POLICY_LOSSES.lookup(name)


def default_loss_options() -> LossOptions:
    """The default loss's options at their defaults (GRPO-TCR's `ppo`)."""
    return LossOptions.config_variant(LossOptions.name)()


register_policy_loss("ppo", policy_loss, options=PPOOptions)
register_policy_loss("gspo", gspo_loss, options=GSPOOptions)
register_policy_loss("cispo", cispo_loss, options=ClipOptions)
