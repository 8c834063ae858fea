"""Confidence intervals by a seeded bootstrap over problems, paired comparisons, and the crossover k.

Every curve in the analysis is a mean over problems of a per-problem value (pass@k, maj@k, Cover@tau indicator),
so one resampling scheme serves all of them: draw problems with replacement (as multinomial counts, so a
replicate is a weighted mean, one matrix product for all k), take percentile intervals. A paired comparison
reuses the same draws for both models, so problem difficulty cancels out of the difference.

Pure numpy; no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class CurveCI:
    """Point estimates and percentile intervals, each (K,)."""

    mean: np.ndarray
    lo: np.ndarray
    hi: np.ndarray

    def to_dict(self) -> dict[str, list[float]]:
        return {"mean": self.mean.tolist(), "lo": self.lo.tolist(), "hi": self.hi.tolist()}


def resample_weights(num_problems: int, num_resamples: int, seed: int) -> np.ndarray:
    """(B, P) multinomial counts: how often each problem appears in each bootstrap replicate (rows sum to P)."""
    if num_problems < 1 or num_resamples < 1:
        raise ValueError(f"need >= 1 problem and resample, got {num_problems}, {num_resamples}")
    rng = np.random.default_rng(seed)
    return rng.multinomial(num_problems, np.full(num_problems, 1.0 / num_problems), size=num_resamples)


def replicate_means(values: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """values (P, K), weights (B, P) -> (B, K) bootstrap replicates of the per-column mean."""
    return weights @ values / weights.sum(axis=1, keepdims=True)


def _interval(reps: np.ndarray, level: float) -> tuple[np.ndarray, np.ndarray]:
    alpha = (1.0 - level) / 2
    return np.quantile(reps, alpha, axis=0), np.quantile(reps, 1.0 - alpha, axis=0)


def bootstrap_curve(values: np.ndarray, weights: np.ndarray, *, level: float = 0.95) -> CurveCI:
    """Mean over problems of values (P, K) with a percentile interval from the replicates in `weights`."""
    values = np.asarray(values, dtype=np.float64)
    lo, hi = _interval(replicate_means(values, weights), level)
    return CurveCI(values.mean(axis=0), lo, hi)


def paired_difference(
    a: np.ndarray, b: np.ndarray, weights: np.ndarray, *, level: float = 0.95
) -> tuple[CurveCI, np.ndarray, np.ndarray]:
    """b - a on the same problems (rows aligned): (interval curve, share of replicates with b > a, replicates)."""
    if a.shape != b.shape:
        raise ValueError(f"paired values must have the same shape, got {a.shape} and {b.shape}")
    diff = np.asarray(b, dtype=np.float64) - np.asarray(a, dtype=np.float64)
    reps = replicate_means(diff, weights)  # (B, K)
    lo, hi = _interval(reps, level)
    return CurveCI(diff.mean(axis=0), lo, hi), (reps > 0).mean(axis=0), reps


def crossover_index(diff: np.ndarray, sign: float | None = None) -> int | None:
    """First index where diff (K,) has the opposite sign of `sign` (default: the sign at index 0).

    With diff = other - base over k = 1..n, this is where the model behind at k = 1 overtakes the leader. A tie
    is not a crossover: both curves saturate at 1 once k > n - c for every problem, which says nothing about who
    is better. None if the leader is never overtaken; 0 if the curves start equal.
    """
    diff = np.asarray(diff, dtype=np.float64)
    s = np.sign(diff[0]) if sign is None else np.sign(sign)
    if s == 0:
        return 0
    hits = np.nonzero(s * diff < 0)[0]
    return int(hits[0]) if hits.size else None


def crossover_interval(
    reps: np.ndarray, sign: float, ks: np.ndarray, *, level: float = 0.95
) -> dict[str, float | None]:
    """The crossover k in each bootstrap replicate (B, K): its percentile interval and how often it exists.

    A replicate without a crossover counts as k = infinity, so an upper bound of None means "possibly none
    within n".
    """
    found = []
    for r in reps:
        i = crossover_index(r, sign)
        found.append(np.inf if i is None else float(ks[i]))
    arr = np.array(found)
    alpha = (1.0 - level) / 2
    lo, hi = np.quantile(arr, alpha, method="lower"), np.quantile(arr, 1 - alpha, method="higher")
    return {
        "lo": None if np.isinf(lo) else float(lo),
        "hi": None if np.isinf(hi) else float(hi),
        "share_with_crossover": float(np.isfinite(arr).mean()),
    }
