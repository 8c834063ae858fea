"""The engine/trainer log-prob correction of an RL step, resolved once: its mode and bounds, the weights it puts on
the advantages, and the metrics it logs. The math is `tirl.algorithms.rollout_correction`'s; this record only
carries `rl.correction.mode` (resolved for the engine by `EngineCapabilities.rollout_correction`) and its
`rl.correction.tis_cap` / `mis_low` / `mis_high` to wherever the old log-probs are known: before the update (a recomputation) or
inside it (an on-policy update's own pass, `tirl.train.rl.update`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from tirl.algorithms.rollout_correction import correction_weights, mismatch_metrics
from tirl.train.batch import TokenBatch


@dataclass(frozen=True)
class RolloutCorrection:
    """`mode` is one of tirl.algorithms.rollout_correction.CORRECTIONS ("none" weighs nothing)."""

    mode: str
    cap: float = 2.0  # token_tis
    low: float = 0.0  # seq_mis
    high: float = 3.0

    @classmethod
    def of(cls, mode: str, cfg: Any) -> RolloutCorrection:
        """`mode` (resolved for the engine) with the bounds of `rl.correction` (`cfg`)."""
        return cls(mode, cap=cfg.tis_cap, low=cfg.mis_low, high=cfg.mis_high)

    @property
    def active(self) -> bool:
        return self.mode != "none"

    def weights(
        self, old_logp: torch.Tensor, sampled: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor | None, dict[str, float]]:
        """The detached (B, T) weights (None for "none") from the trainer's old log-probs and the engine's sampled
        ones, with the mismatch metrics (`rollout/...`) and the correction's own (`rollout_corr/...`)."""
        w, stats = correction_weights(
            self.mode, old_logp, sampled, mask, cap=self.cap, low=self.low, high=self.high
        )
        return w, mismatch_metrics(old_logp, sampled, mask) | stats

    def weighted(
        self, advantages: torch.Tensor, old_logp: torch.Tensor, sampled: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        """(B, T) `advantages` times the correction's weights (as they are for "none"), without the metrics."""
        w, _ = correction_weights(
            self.mode, old_logp, sampled, mask, cap=self.cap, low=self.low, high=self.high
        )
        return advantages if w is None else advantages * w

    def apply(self, batch: TokenBatch, old_logp: torch.Tensor, sampled: torch.Tensor) -> dict[str, float]:
        """Weight `batch`'s per-token advantages in place; returns the metrics. The PPO/dual-clip surrogate is
        positively homogeneous in the advantage (loss(w A) = w loss(A) for w >= 0,
        tests/algorithms/test_rollout_correction.py), so this weights each token's loss without touching the
        micro-batched update."""
        w, metrics = self.weights(old_logp, sampled, batch.loss_mask)
        if w is not None:
            batch.extra["advantages"] = batch.extra["advantages"] * w
        return metrics


__all__ = ["RolloutCorrection"]
