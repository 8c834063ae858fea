"""Sampling-based evaluation metrics from n graded samples per problem: avg@n, pass@k, maj@k.

All metrics are estimators over k-subsets of the n samples (without replacement), so they use every sample and
do not depend on sample order. Pure Python + numpy, no torch: evaluation runs wherever the grades are.

Not here: answer extraction and equivalence. ``maj_at_k`` groups answers by exact string equality, so
callers must normalise answers first (and, if two different strings are mathematically equal, map them to one
canonical string with the verifier); that grouping is the caller's job.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from itertools import combinations

import numpy as np


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k = 1 - C(n-c, k) / C(n, k) (Chen et al. 2021), in the product form that never overflows.

    n samples, c of them correct: the probability that a uniformly random k-subset holds at least one correct.
    """
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n, got n={n}, k={k}")
    if n - c < k:
        return 1.0  # every k-subset must contain a correct sample
    return 1.0 - math.prod(1.0 - k / j for j in range(n - c + 1, n + 1))


def avg_at_n(correct: Sequence[bool]) -> float:
    """Share of correct samples (= pass@1)."""
    if len(correct) == 0:
        raise ValueError("avg_at_n needs at least one sample")
    return sum(bool(x) for x in correct) / len(correct)


def pass_at_k_curve(n: int, c: int, ks: Sequence[int]) -> dict[int, float]:
    """pass@k for each k in ks."""
    return {k: pass_at_k(n, c, k) for k in ks}


def default_ks(n: int) -> list[int]:
    """1, 2, 4, ... up to n, plus n itself when it is not a power of two."""
    if n < 1:
        raise ValueError(f"need n >= 1, got n={n}")
    ks = [1 << i for i in range(n.bit_length()) if (1 << i) <= n]
    if ks[-1] != n:
        ks.append(n)
    return ks


def _majority_correctness(
    subsets: np.ndarray, answer_ids: np.ndarray, answer_correct: np.ndarray
) -> np.ndarray:
    """Expected correctness of each subset's majority answer under a uniform random tie-break.

    subsets: (S, k) sample indices; answer_ids: (n,) answer index per sample, -1 for no answer;
    answer_correct: (A,) float. Returns (S,). A subset with only unanswered samples scores 0.
    """
    num_subsets, num_answers = subsets.shape[0], answer_correct.shape[0]
    ids = answer_ids[subsets]  # (S, k)
    rows = np.broadcast_to(np.arange(num_subsets)[:, None], ids.shape)
    valid = ids >= 0
    counts = np.zeros((num_subsets, num_answers + 1), dtype=np.int64)  # last column is a dummy for "none"
    np.add.at(counts, (rows[valid], ids[valid]), 1)
    counts = counts[:, :num_answers]  # (S, A)
    top = counts.max(axis=1, initial=0)  # (S,)
    tied = (counts == top[:, None]) & (top[:, None] > 0)  # (S, A)
    num_tied = tied.sum(axis=1)
    tied_correct = (tied * answer_correct[None, :]).sum(axis=1)
    return np.where(num_tied > 0, tied_correct / np.maximum(num_tied, 1), 0.0)


def maj_at_k(
    answers: Sequence[str | None],
    correct: Sequence[bool],
    k: int,
    *,
    exact_limit: int = 20000,
    num_samples: int = 2000,
    seed: int = 0,
) -> tuple[float, float]:
    """Majority-vote accuracy over k-subsets of the n samples: (value, standard error).

    The value is the expectation, over k-subsets drawn without replacement, of whether the subset's most
    frequent answer is correct. Samples without an answer (None) never win a vote; ties count the mean
    correctness of the tied answers (a uniform random tie-break). An answer is correct if any of its samples
    is flagged correct (flags are assumed consistent per answer). Exact, with standard error 0.0, when
    C(n, k) <= exact_limit; otherwise a seeded Monte Carlo over ``num_samples`` random subsets.
    """
    n = len(answers)
    if len(correct) != n:
        raise ValueError(f"answers and correct differ in length: {n} != {len(correct)}")
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n, got n={n}, k={k}")
    if num_samples < 2:
        raise ValueError(f"num_samples must be >= 2 for a standard error, got {num_samples}")

    index: dict[str, int] = {}
    answer_ids = np.array(
        [-1 if a is None else index.setdefault(a, len(index)) for a in answers], dtype=np.int64
    )
    answer_correct = np.zeros(len(index), dtype=np.float64)
    for a, ok in zip(answers, correct, strict=True):
        if a is not None and ok:
            answer_correct[index[a]] = 1.0

    if math.comb(n, k) <= exact_limit:
        subsets = np.array(list(combinations(range(n), k)), dtype=np.int64).reshape(-1, k)  # (C(n,k), k)
        return float(_majority_correctness(subsets, answer_ids, answer_correct).mean()), 0.0
    rng = np.random.default_rng(seed)
    subsets = rng.random((num_samples, n)).argsort(axis=1)[:, :k]  # (S, k), uniform k-subsets
    values = _majority_correctness(subsets, answer_ids, answer_correct)
    return float(values.mean()), float(values.std(ddof=1) / math.sqrt(num_samples))


def summarize_problem(
    correct: Sequence[bool], answers: Sequence[str | None], ks: Sequence[int]
) -> dict[str, float]:
    """One problem's "avg@n", "pass@{k}" and "maj@{k}" for each k."""
    n, c = len(correct), sum(bool(x) for x in correct)
    out = {"avg@n": avg_at_n(correct)}
    for k in ks:
        out[f"pass@{k}"] = pass_at_k(n, c, k)
    for k in ks:
        out[f"maj@{k}"] = maj_at_k(answers, correct, k)[0]
    return out


def summarize(
    problems: Mapping[str, tuple[Sequence[bool], Sequence[str | None]]], ks: Sequence[int] | None = None
) -> dict[str, float]:
    """Mean over problems of ``summarize_problem``, plus "num_problems" and "samples_per_problem".

    problems maps a problem id to (correct, answers). Every problem must have the same n (otherwise pass@k
    means different things per problem); ks defaults to ``default_ks(n)``.
    """
    if not problems:
        raise ValueError("summarize needs at least one problem")
    n = len(next(iter(problems.values()))[0])
    for pid, (correct, answers) in problems.items():
        if len(correct) != n or len(answers) != n:
            raise ValueError(
                f"problem {pid!r} has {len(correct)} grades and {len(answers)} answers; expected {n} of each"
            )
    ks = default_ks(n) if ks is None else list(ks)
    per_problem = [summarize_problem(correct, answers, ks) for correct, answers in problems.values()]
    out = {key: float(np.mean([p[key] for p in per_problem])) for key in per_problem[0]}
    out["num_problems"] = float(len(problems))
    out["samples_per_problem"] = float(n)
    return out


def pass_at_k_table(n: int, correct_counts: Sequence[int]) -> np.ndarray:
    """Unbiased pass@k for every k in 1..n and every problem: (P, n), column k-1 holds pass@k.

    Uses C(n-c, k) / C(n, k) = prod_{i<k} (n-c-i) / (n-i) as a running product, so the whole table costs
    O(distinct c x n) and never overflows.
    """
    if n < 1:
        raise ValueError(f"need n >= 1, got n={n}")
    cs = np.asarray(correct_counts, dtype=np.int64)
    if cs.size and (cs.min() < 0 or cs.max() > n):
        raise ValueError(f"correct counts must lie in [0, n={n}], got {cs.min()}..{cs.max()}")
    out = np.empty((cs.size, n), dtype=np.float64)
    i = np.arange(n, dtype=np.float64)
    for c in np.unique(cs):
        fail_ratio = np.cumprod(np.clip((n - c - i) / (n - i), 0.0, None))  # C(n-c, k)/C(n, k) for k = 1..n
        out[cs == c] = 1.0 - fail_ratio
    return out


def cover_at_tau(success_rates: Sequence[float], taus: Sequence[float]) -> dict[float, float]:
    """Cover@tau: share of problems whose success rate is at least tau (Dragoi et al. 2025), for each tau."""
    rates = np.asarray(success_rates, dtype=np.float64)
    if rates.size == 0:
        raise ValueError("cover_at_tau needs at least one problem")
    return {float(t): float((rates >= t - 1e-12).mean()) for t in taus}
