"""verl's validation metrics, `best@k` and `maj@k` by bootstrap, so tirl's numbers can sit next to a verl paper's.

verl (`process_validation_metrics`, the metric the Open-AgentRL paper reports as pass@k and maj@k) estimates, per
problem with n samples: seed numpy's legacy generator with 42, draw 1,000 index sets of size k *with replacement*,
and average over the draws
  - best@k: the max of the drawn correctness flags;
  - maj@k: the correctness of the drawn majority answer, voting on the raw answer strings (a missing answer is
    the empty string, which can win), ties to the answer seen first in the draw, its correctness taken from its
    first drawn sample.
The generator is re-seeded for every problem and every k, so each problem sees the same index draws.

These are biased estimators (draws repeat samples, so best@n stays below "any of n correct": one correct of 32
gives about 0.64); tirl's own unbiased pass@k and exact maj@k (metrics.py) are the better numbers. Keep these for
comparison only. Pure numpy; no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

DRAWS = 1000
SEED = 42


def bootstrap_indices(n: int, k: int, *, draws: int = DRAWS, seed: int = SEED) -> np.ndarray:
    """(draws, k) sample indices, the ones verl draws: numpy's legacy generator seeded with `seed`."""
    if n < 1 or k < 1 or draws < 1:
        raise ValueError(f"need n, k and draws >= 1, got n={n}, k={k}, draws={draws}")
    return np.random.RandomState(seed).choice(n, size=(draws, k), replace=True)


def bootstrap_best_at_k(correct: Sequence[bool], k: int, *, draws: int = DRAWS, seed: int = SEED) -> float:
    """Mean over the draws of the best (max) correctness among the k drawn samples."""
    flags = np.asarray(correct, dtype=np.float64)  # (n,)
    idx = bootstrap_indices(len(flags), k, draws=draws, seed=seed)  # (draws, k)
    return float(flags[idx].max(axis=1).mean())


def _first_seen_majority(ids: np.ndarray, num_answers: int) -> np.ndarray:
    """ids (D, k) answer ids per draw -> (D,) position in the draw of the first sample of its majority answer."""
    num_draws, k = ids.shape
    rows = np.broadcast_to(np.arange(num_draws)[:, None], ids.shape)
    counts = np.zeros((num_draws, num_answers), dtype=np.int64)  # (D, A)
    np.add.at(counts, (rows, ids), 1)
    first = np.full((num_draws, num_answers), k, dtype=np.int64)  # (D, A) first position of each answer
    for pos in range(k - 1, -1, -1):
        first[np.arange(num_draws), ids[:, pos]] = pos
    top = counts.max(axis=1, keepdims=True)  # (D, 1)
    # among the answers with the top count, the one whose first sample comes first in the draw
    return np.where(counts == top, first, k).min(axis=1)


def bootstrap_maj_at_k(
    answers: Sequence[str | None], correct: Sequence[bool], k: int, *, draws: int = DRAWS, seed: int = SEED
) -> float:
    """Mean over the draws of the majority answer's correctness (raw strings vote; None votes as "")."""
    if len(answers) != len(correct):
        raise ValueError(f"answers and correct differ in length: {len(answers)} != {len(correct)}")
    index: dict[str, int] = {}
    ids = np.array([index.setdefault("" if a is None else a, len(index)) for a in answers], dtype=np.int64)
    flags = np.asarray(correct, dtype=np.float64)  # (n,)
    idx = bootstrap_indices(len(ids), k, draws=draws, seed=seed)  # (D, k)
    pos = _first_seen_majority(ids[idx], len(index))  # (D,)
    winners = idx[np.arange(len(idx)), pos]  # (D,) the first drawn sample of each draw's majority answer
    return float(flags[winners].mean())


def verl_ks(n: int) -> list[int]:
    """The k verl reports for n samples: 2, 4, 8, ... below n, then n (none for n = 1)."""
    if n <= 1:
        return []
    ks, k = [], 2
    while k < n:
        ks.append(k)
        k *= 2
    return [*ks, n]


def bootstrap_summary(
    correct: Sequence[bool], answers: Sequence[str | None], ks: Sequence[int]
) -> dict[str, float]:
    """One problem's `bootstrap_best@k` and `bootstrap_maj@k` (verl's `best@k/mean`, `maj@k/mean`) for each k."""
    out: dict[str, float] = {}
    for k in ks:
        out[f"bootstrap_best@{k}"] = bootstrap_best_at_k(correct, k)
    for k in ks:
        out[f"bootstrap_maj@{k}"] = bootstrap_maj_at_k(answers, correct, k)
    return out


__all__ = [
    "DRAWS",
    "SEED",
    "bootstrap_best_at_k",
    "bootstrap_indices",
    "bootstrap_maj_at_k",
    "bootstrap_summary",
    "verl_ks",
]
