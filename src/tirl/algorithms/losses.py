"""Policy-gradient losses on per-token log-probabilities, and the token/sequence aggregation they share.

The trainer runs the model and passes tensors in; nothing here reads trainer state or a config object.
Every policy loss has the uniform signature
``fn(logp, old_logp, advantages, loss_mask, *, <float hyperparameters>, agg, norm_len, num_tokens, num_seqs)
-> (loss, stats)`` (the last two: the mini-batch's denominators when the call sees one micro-batch of it),
is added with ``register_policy_loss`` (which checks that signature) and is picked by name once at start-up via
``get_policy_loss``. ``aggregate`` is public so entropy or KL terms
reduce over tokens exactly as the policy loss does.

``loss_mask`` is 0/1 (bool or float): 1 on sampled assistant tokens, 0 on prompt, tool-output and padding
tokens. Masked-out positions are zero-filled before any sum, so garbage (even inf) there cannot leak into
the loss.

Not here: value losses, KL/entropy terms (see ``regularizers``), and anything that computes log-probs.
"""

from __future__ import annotations

from collections.abc import Callable

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
    clip_c: float = 10.0,
    agg: str = "seq-mean-token-mean",
    norm_len: int | None = None,
    num_tokens: float | torch.Tensor | None = None,
    num_seqs: float | torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GSPO (arXiv 2507.18071): one importance ratio per sequence, the geometric mean of its token ratios.

    Shapes as `policy_loss`. s_i = exp(mean over i's trained tokens of (logp - old_logp)); per token the ratio is
    sg(s_i) * pi / sg(pi), so the value is s_i and the gradient flows through each token's log-prob; the PPO clip
    applies to s_i (the paper's ranges are ~1e-4, hence these defaults). No dual clip (`clip_c` is accepted and
    ignored, for the uniform signature). As verl's `compute_policy_loss_gspo`, log s is capped at 10.
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
    clip_c: float = 10.0,
    agg: str = "token-mean",
    norm_len: int | None = None,
    num_tokens: float | torch.Tensor | None = None,
    num_seqs: float | torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """CISPO (MiniMax-M1, arXiv 2506.13585): REINFORCE weighted by the clipped, detached importance ratio.

    Shapes as `policy_loss`. Per token: -sg(clip(ratio, 1 - clip_low, 1 + clip_high)) * A * logp. Unlike PPO no
    token is dropped from the gradient when its ratio leaves the range; only its weight is capped. `clip_c` is
    accepted and ignored (uniform signature). Matches verl's `compute_policy_loss_cispo`.
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

# what the trainer passes every policy loss, by keyword
LOSS_KEYWORDS = ("clip_low", "clip_high", "clip_c", "agg", "norm_len", "num_tokens", "num_seqs")
POLICY_LOSSES: Registry[PolicyLoss] = Registry("policy loss")


def register_policy_loss(name: str, fn: PolicyLoss, *, replace: bool = False) -> PolicyLoss:
    """Add `fn(logp, old_logp, advantages, loss_mask, *, <LOSS_KEYWORDS>, ...) -> (loss, stats)` under `name`;
    returns it. A taken name raises unless `replace=True`; a function of another shape raises now, not mid-run."""
    check_signature(fn, "policy loss", name, positional=4, keywords=LOSS_KEYWORDS)
    return POLICY_LOSSES.add(name, fn, replace=replace)


def get_policy_loss(name: str) -> PolicyLoss:
    """Look up a policy loss by name; a bad name raises and lists the valid ones."""
    return POLICY_LOSSES.lookup(name)


register_policy_loss("ppo", policy_loss)
register_policy_loss("gspo", gspo_loss)
register_policy_loss("cispo", cispo_loss)
