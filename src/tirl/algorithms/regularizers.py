"""Per-token regularizers: KL to a reference policy and policy entropy.

Both return per-token (B, T) tensors; reduce them with ``losses.aggregate`` under the same mask and
aggregation as the policy loss. Both are off by default in the trainer (the recipe uses neither); they are
here so turning one on is a config change, not new math.

Not here: the weighting of these terms in the total loss (the trainer owns that) or a reference model.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

# As verl's low_var_kl: clamp the log-ratio before exp (keeps exp finite) and the k3 value itself, so a
# handful of tokens the reference finds near-impossible cannot blow up the penalty or its gradient.
_K3_LOG_RATIO_LIMIT = 20.0
_K3_VALUE_LIMIT = 10.0


def _k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Naive estimator log(pi/ref): unbiased for KL(pi || ref) but high variance and can be negative."""
    return logp - ref_logp


def _k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 = ref/pi - log(ref/pi) - 1: unbiased, lower variance, never negative (x - 1 >= log x).

    Clamped to [-10, 10] as verl does (the lower bound never bites since k3 >= 0).
    """
    log_ratio = (ref_logp - logp).clamp(-_K3_LOG_RATIO_LIMIT, _K3_LOG_RATIO_LIMIT)  # (B, T)
    k3 = torch.exp(log_ratio) - log_ratio - 1.0
    return k3.clamp(-_K3_VALUE_LIMIT, _K3_VALUE_LIMIT)


KL_ESTIMATORS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {"k1": _k1, "k3": _k3}


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, *, estimator: str = "k3") -> torch.Tensor:
    """Per-token KL(pi || ref) estimate from sampled-token log-probs. logp, ref_logp: (B, T) -> (B, T)."""
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"unknown KL estimator {estimator!r}; valid: {sorted(KL_ESTIMATORS)}")
    return KL_ESTIMATORS[estimator](logp, ref_logp)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the softmax over the last dim. logits: (B, T, V) -> (B, T).

    Computed from log-probs via logsumexp, so large logits do not overflow; -inf logits (masked vocabulary)
    contribute exactly 0 instead of 0 * -inf = NaN.
    """
    log_p = logits - torch.logsumexp(logits, dim=-1, keepdim=True)  # (B, T, V)
    p = log_p.exp()
    return -(p * log_p.masked_fill(p == 0, 0.0)).sum(dim=-1)
