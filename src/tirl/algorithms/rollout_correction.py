"""Engine/trainer log-prob mismatch: metrics and truncated importance-sampling corrections.

The rollout engine samples with its own kernels (vLLM, a server), so its log-probs pi_rollout differ from the
trainer's recomputation pi_old on the same ids, even at the same weights; treating pi_old as the behaviour policy
biases the gradient. Per loss-mask token, delta_t = log pi_old - log pi_rollout.

- token_tis (verl's `rollout_is: token`, `rollout_is_threshold`): w_t = min(exp(delta_t), cap), cap 2.0.
- seq_mis (TRL's `vllm_importance_sampling_mode="sequence_mask"`): rho = exp(sum_t delta_t) per sequence; a
  sequence whose rho lies outside [low, high] gets weight 0 (masked), inside it keeps rho. TRL's defaults: no
  lower bound (0), high 3.0.
log-ratios are clamped to [-20, 20] before exp (verl's safety bound), so one wild token cannot give inf or NaN.
"""

from __future__ import annotations

import torch

CORRECTIONS = ("none", "token_tis", "seq_mis")
_SAFETY = 20.0


def _delta(old_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, T) log pi_old - log pi_rollout on mask tokens, 0 elsewhere."""
    return (old_logp - rollout_logp) * mask


def mismatch_metrics(
    old_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor
) -> dict[str, float]:
    """How far the engine's log-probs are from the trainer's, over loss-mask tokens (B, T each).

    logprob_diff_mean / _max: mean and max of |delta_t|. kl_k3: the k3 estimate of KL(pi_rollout || pi_old) from
    tokens sampled by the engine, mean of exp(delta) - delta - 1 (>= 0 per token, unbiased, low variance).
    """
    m = mask.bool()
    if not m.any():
        return {"rollout/logprob_diff_mean": 0.0, "rollout/logprob_diff_max": 0.0, "rollout/kl_k3": 0.0}
    d = (old_logp - rollout_logp)[m].clamp(-_SAFETY, _SAFETY)
    return {
        "rollout/logprob_diff_mean": float(d.abs().mean()),
        "rollout/logprob_diff_max": float(d.abs().max()),
        "rollout/kl_k3": float((torch.exp(d) - d - 1).mean()),
    }


def token_tis_weights(
    old_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor, *, cap: float = 2.0
) -> torch.Tensor:
    """(B, T) truncated per-token importance weights min(pi_old / pi_rollout, cap); 0 off the mask."""
    if cap <= 0:
        raise ValueError(f"token_tis cap must be > 0, got {cap}")
    d = _delta(old_logp, rollout_logp, mask).clamp(-_SAFETY, _SAFETY)
    return torch.exp(d).clamp(max=cap) * mask


def seq_mis_weights(
    old_logp: torch.Tensor,
    rollout_logp: torch.Tensor,
    mask: torch.Tensor,
    *,
    low: float = 0.0,
    high: float = 3.0,
) -> torch.Tensor:
    """(B, T) sequence-level weights: rho = prod_t pi_old / pi_rollout over the sequence's mask tokens, broadcast
    to its mask tokens when low <= rho <= high, else 0 (the sequence is masked out of the loss)."""
    if not 0.0 <= low < high:
        raise ValueError(f"seq_mis bounds must satisfy 0 <= low < high, got {low}, {high}")
    log_rho = _delta(old_logp, rollout_logp, mask).sum(dim=-1).clamp(-_SAFETY, _SAFETY)  # (B,)
    rho = torch.exp(log_rho)
    keep = (rho >= low) & (rho <= high)
    return (rho * keep)[:, None] * mask


def correction_weights(
    mode: str,
    old_logp: torch.Tensor,
    rollout_logp: torch.Tensor,
    mask: torch.Tensor,
    *,
    cap: float = 2.0,
    low: float = 0.0,
    high: float = 3.0,
) -> tuple[torch.Tensor | None, dict[str, float]]:
    """The detached (B, T) weight of `mode` (None for "none") and its stats (mean weight, masked share)."""
    if mode not in CORRECTIONS:
        raise ValueError(f"unknown rollout correction {mode!r}; valid: {', '.join(CORRECTIONS)}")
    if mode == "none":
        return None, {}
    if mode == "token_tis":
        w = token_tis_weights(old_logp, rollout_logp, mask, cap=cap)
        capped = ((old_logp - rollout_logp) > torch.log(torch.tensor(cap))) & mask.bool()
        frac = float(capped.sum() / mask.sum().clamp(min=1))
        stats = {"rollout_corr/capped_frac": frac}
    else:
        w = seq_mis_weights(old_logp, rollout_logp, mask, low=low, high=high)
        has = mask.sum(dim=-1) > 0
        dropped = has & (w.sum(dim=-1) == 0)
        stats = {"rollout_corr/masked_seq_frac": float(dropped.sum() / has.sum().clamp(min=1))}
    m = mask.bool()
    stats["rollout_corr/weight_mean"] = float(w[m].mean()) if m.any() else 0.0
    return w.detach(), stats
