"""Temperatures chosen off the test set, and verdicts pooled over seeds: pure functions over per-problem counts.

A model's best temperature per k, picked on the test problems and reported on the same problems, is optimistic
(the envelope of `tirl.eval.accuracy` is that, and stays only as a labelled upper bound). Here the choice is made
on a validation slice and the test set only reports it:

- `choose_temperatures`: per k, the temperature of the grid with the highest mean validation pass@k, with a flag
  when the choice is the grid's lowest or highest temperature (the best may lie outside the grid);
- `curve_at_chosen`: the test pass@k curve, each k at its chosen temperature, with a bootstrap interval over test
  problems; `paired_at_chosen`: two models, each at its own chosen temperatures, paired over test problems;
- `pooled_difference` / `paired_over_seeds`: the same difference over several seeds of the whole training chain
  (seed s of model A paired with seed s of model B on the same problems), pooled with a two-level bootstrap over
  seeds and problems, each seed's own verdict, and in how many seeds a verdict holds.

Inputs are correct counts c out of n samples per problem (`Counts`); pass@k is the unbiased estimator
(`tirl.eval.metrics.pass_at_k_table`), intervals are percentile intervals (`tirl.eval.bootstrap`). A verdict at k
is "above" (the interval of other - base lies above 0), "below" (below 0) or "includes 0".

Pure numpy; no I/O, no runs, no report layout (that is `tirl.eval.selection_report`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from tirl.eval.bootstrap import CurveCI, bootstrap_curve, paired_difference, resample_weights
from tirl.eval.metrics import pass_at_k_table

ABOVE, BELOW, INCLUDES_ZERO = "above", "below", "includes 0"
TIE_TOLERANCE = 1e-12  # validation means this close are a tie (the same counts summed in another order)
REFERENCE_T = 1.0  # ties go to the temperature closest to this: the model's own distribution


@dataclass(frozen=True)
class Counts:
    """One model at one temperature on one data source: problem ids, correct counts c (P,), samples n (P,)."""

    ids: list[str]
    c: np.ndarray
    n: np.ndarray

    def __post_init__(self) -> None:
        c = np.asarray(self.c, dtype=np.int64).reshape(-1)
        n = np.broadcast_to(np.asarray(self.n, dtype=np.int64), c.shape).copy()
        if len(self.ids) != c.size or len(set(self.ids)) != c.size:
            raise ValueError(f"counts need one distinct id per problem: {len(self.ids)} ids, {c.size} counts")
        if c.size and (n.min() < 1 or c.min() < 0 or (c > n).any()):
            raise ValueError("counts must satisfy 0 <= c <= n and n >= 1 for every problem")
        object.__setattr__(self, "c", c)
        object.__setattr__(self, "n", n)

    def subset(self, ids: Sequence[str]) -> Counts:
        pos = {pid: i for i, pid in enumerate(self.ids)}
        rows = [pos[pid] for pid in ids]
        return Counts(list(ids), self.c[rows], self.n[rows])


def pass_at_ks(counts: Counts, ks: Sequence[int]) -> np.ndarray:
    """(P, K) unbiased pass@k of each problem at each k of ks; every problem needs n >= max(ks)."""
    ks = list(ks)
    out = np.empty((len(counts.ids), len(ks)))
    if not ks:
        return out
    if min(ks) < 1 or (counts.n.size and max(ks) > counts.n.min()):
        raise ValueError(f"k must lie in 1..n (n = {counts.n.min()}), got {min(ks)}..{max(ks)}")
    cols = np.asarray(ks) - 1
    for n in np.unique(counts.n):  # the table needs one n; problems with another n are another table
        rows = counts.n == n
        out[rows] = pass_at_k_table(int(n), counts.c[rows])[:, cols]
    return out


def common_ids(tables: Sequence[Counts]) -> list[str]:
    """The problems every table has, sorted."""
    return sorted(set.intersection(*(set(t.ids) for t in tables))) if tables else []


def verdicts(lo: np.ndarray, hi: np.ndarray) -> list[str]:
    """Per k: ABOVE when the interval of the difference lies above 0, BELOW when below, else INCLUDES_ZERO."""
    return [ABOVE if a > 0 else BELOW if b < 0 else INCLUDES_ZERO for a, b in zip(lo, hi, strict=True)]


@dataclass(frozen=True)
class TemperatureChoice:
    """Per k: the chosen temperature, whether it is an edge of the grid, and the validation means behind it."""

    ks: list[int]
    temperatures: list[float]  # the grid, ascending
    chosen: list[float]  # (K,)
    on_edge: list[bool]  # (K,) chosen is the grid's lowest or highest temperature
    validation: np.ndarray  # (T, K) mean validation pass@k of each temperature
    num_problems: int

    def to_dict(self) -> dict:
        return {
            "ks": self.ks,
            "temperatures": self.temperatures,
            "num_problems": self.num_problems,
            "chosen_temperature": self.chosen,
            "on_edge": self.on_edge,
            "edge_ks": [k for k, e in zip(self.ks, self.on_edge, strict=True) if e],
            "validation_pass@k": {
                f"{t:g}": row.tolist() for t, row in zip(self.temperatures, self.validation, strict=True)
            },
        }


def choose_temperatures(val_counts_by_t: Mapping[float, Counts], ks: Sequence[int]) -> TemperatureChoice:
    """Per k, the temperature with the highest mean validation pass@k over the problems every temperature has.

    Ties (means within TIE_TOLERANCE, as when pass@k saturates at 1 for every temperature) go to the temperature
    closest to 1.0, the model's own distribution, and between two equally close (0.8 and 1.2) to the lower one:
    a fixed rule, so the choice never depends on the grid's order. A choice at the grid's lowest or highest
    temperature is flagged (`on_edge`): the best temperature may lie beyond it, so the grid was too narrow to
    show it. A one-temperature grid is its own edge.
    """
    if not val_counts_by_t:
        raise ValueError("choosing a temperature needs validation counts at one temperature at least")
    temps = sorted(float(t) for t in val_counts_by_t)
    tables = [val_counts_by_t[t] for t in temps]
    ids = common_ids(tables)
    if not ids:
        raise ValueError(f"the validation runs at T={', '.join(f'{t:g}' for t in temps)} share no problem")
    ks = list(ks)
    means = np.stack([pass_at_ks(t.subset(ids), ks).mean(axis=0) for t in tables])  # (T, K)
    chosen = []
    for j in range(len(ks)):
        tied = [t for t, m in zip(temps, means[:, j], strict=True) if m >= means[:, j].max() - TIE_TOLERANCE]
        chosen.append(min(tied, key=lambda t: (abs(t - REFERENCE_T), t)))
    edges = {temps[0], temps[-1]}
    return TemperatureChoice(ks, temps, chosen, [t in edges for t in chosen], means, len(ids))


def missing_temperatures(
    test_counts_by_t: Mapping[float, Counts], choice: TemperatureChoice
) -> dict[float, list]:
    """Chosen temperature -> the ks it was chosen for, for each one the test runs lack."""
    out: dict[float, list] = {}
    for k, t in zip(choice.ks, choice.chosen, strict=True):
        if t not in test_counts_by_t:
            out.setdefault(t, []).append(k)
    return out


@dataclass(frozen=True)
class ChosenCurve:
    """Test pass@k with each k at its validation-chosen temperature."""

    ks: list[int]
    chosen: list[float]
    ids: list[str]
    values: np.ndarray  # (P, K) per-problem test pass@k at the chosen temperature of each k
    ci: CurveCI

    def to_dict(self) -> dict:
        return {"num_problems": len(self.ids), "ks": self.ks, "pass@k": self.ci.to_dict()}


def curve_at_chosen(
    test_counts_by_t: Mapping[float, Counts],
    choice: TemperatureChoice,
    *,
    num_resamples: int = 1000,
    seed: int = 0,
    level: float = 0.95,
) -> ChosenCurve:
    """The test curve at the chosen temperatures, on the problems every chosen temperature's test counts have.

    It runs from k = 1 up to the last k the test samples at its chosen temperature still reach (n >= k). The
    interval resamples test problems; the choice is fixed (made on other problems, so nothing is selected here).
    """
    missing = missing_temperatures(test_counts_by_t, choice)
    if missing:
        raise ValueError(f"the test counts lack the chosen temperatures {sorted(missing)}")
    used = sorted(set(choice.chosen))
    ids = common_ids([test_counts_by_t[t] for t in used])
    if not ids:
        raise ValueError("the test counts at the chosen temperatures share no problem")
    tables = {t: test_counts_by_t[t].subset(ids) for t in used}
    ks: list[int] = []
    for k, t in zip(choice.ks, choice.chosen, strict=True):
        if k > tables[t].n.min():
            break
        ks.append(k)
    chosen = choice.chosen[: len(ks)]
    values = np.empty((len(ids), len(ks)))
    for t in used:
        cols = [j for j, c in enumerate(chosen) if c == t]
        if cols:
            values[:, cols] = pass_at_ks(tables[t], [ks[j] for j in cols])
    ci = bootstrap_curve(values, resample_weights(len(ids), num_resamples, seed), level=level)
    return ChosenCurve(ks, chosen, ids, values, ci)


def align(
    base_ids: Sequence[str], base: np.ndarray, other_ids: Sequence[str], other: np.ndarray
) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Rows of two (P, K) tables on the problems both have (sorted), over their common leading columns."""
    ids = sorted(set(base_ids) & set(other_ids))
    k = min(base.shape[1], other.shape[1])
    pa, pb = {p: i for i, p in enumerate(base_ids)}, {p: i for i, p in enumerate(other_ids)}
    return ids, base[[pa[p] for p in ids], :k], other[[pb[p] for p in ids], :k]


@dataclass(frozen=True)
class PairedDifference:
    """other - base of pass@k, paired over problems, per k."""

    ks: list[int]
    ids: list[str]
    diff: CurveCI
    share_other_better: np.ndarray  # (K,) share of bootstrap replicates with other > base
    verdict: list[str]

    def to_dict(self) -> dict:
        return {
            "num_problems": len(self.ids),
            "ks": self.ks,
            "diff": self.diff.to_dict(),
            "share_other_better": self.share_other_better.tolist(),
            "verdict": self.verdict,
        }


def paired_at_chosen(
    base: ChosenCurve, other: ChosenCurve, *, num_resamples: int = 1000, seed: int = 0, level: float = 0.95
) -> PairedDifference:
    """other - base, each at its own chosen temperature per k, on the test problems both have (one problem draw
    serves both models in each replicate, so problem difficulty cancels)."""
    ids, a, b = align(base.ids, base.values, other.ids, other.values)
    if not ids:
        raise ValueError("the two models share no test problem")
    w = resample_weights(len(ids), num_resamples, seed)
    diff, share, _ = paired_difference(a, b, w, level=level)
    return PairedDifference(base.ks[: a.shape[1]], ids, diff, share, verdicts(diff.lo, diff.hi))


@dataclass(frozen=True)
class PooledDifference:
    """other - base pooled over seeds: the pooled interval, each seed's interval and verdict, per k."""

    seeds: list[str]
    ks: list[int]
    num_problems: int
    pooled: CurveCI
    per_seed: list[CurveCI]
    per_seed_verdicts: list[list[str]]  # (S, K)
    verdict: list[str]  # (K,) of the pooled interval

    def holds_in(self, k: int, verdict: str) -> int:
        """In how many seeds the verdict at k is `verdict` (e.g. BELOW: the seed's interval lies below 0)."""
        j = self.ks.index(k)
        return sum(v[j] == verdict for v in self.per_seed_verdicts)

    def to_dict(self) -> dict:
        S = len(self.seeds)
        holds = [sum(v[j] == self.verdict[j] for v in self.per_seed_verdicts) for j in range(len(self.ks))]
        return {
            "seeds": self.seeds,
            "num_problems": self.num_problems,
            "ks": self.ks,
            "pooled": self.pooled.to_dict(),
            "verdict": self.verdict,
            "holds_in": holds,  # seeds whose own verdict equals the pooled one, per k (of len(seeds))
            "per_seed": {
                s: {**ci.to_dict(), "verdict": v}
                for s, ci, v in zip(self.seeds, self.per_seed, self.per_seed_verdicts, strict=True)
            },
            "seed_draws": math.comb(2 * S - 1, S),  # distinct multisets a draw of S seeds from S can give
        }


def pooled_difference(
    diffs: np.ndarray,
    seeds: Sequence[str],
    ks: Sequence[int],
    *,
    num_resamples: int = 1000,
    seed: int = 0,
    level: float = 0.95,
) -> PooledDifference:
    """Mean of other - base over seeds and problems, with a two-level bootstrap interval.

    diffs (S, P, K): seed s, problem p, k; the same P problems in the same order for every seed (the test set is
    fixed; a seed is one chain: SFT from the base, filter, RL, and both models of a pair come from the same seed).
    Each replicate draws S seeds with replacement and, once, P problems with replacement, and the same problem
    draw serves every drawn seed: the problems are shared by all seeds, so a problem's effect (hard for RL in
    seed 0 is likely hard in seed 1) is one random draw, not S independent ones. Drawing problems independently
    per seed would treat S copies of one problem as S problems and shrink the problem part of the interval by
    up to a factor of sqrt(S). Resampling both factors at once is the pigeonhole bootstrap for a crossed design
    (Owen 2007, Annals of Applied Statistics), which errs on the wide side. The point estimate is the plain mean
    over seeds and problems.

    With few seeds the seed level is coarse: a draw of 3 seeds from 3 takes one of only 10 multisets, and the
    bootstrap variance of a mean of S values is (S - 1) / S of the usual estimate (2/3 at S = 3), so the seed
    part of the interval is narrow; the per-seed verdicts and `holds_in` say what each seed shows on its own.
    Each seed's interval resamples that seed's problems (the same draws as the pooled replicates).
    """
    d = np.asarray(diffs, dtype=np.float64)
    if d.ndim != 3 or d.shape[0] != len(seeds) or d.shape[2] != len(ks):
        raise ValueError(f"diffs must be (seeds={len(seeds)}, problems, ks={len(ks)}), got {d.shape}")
    S, P, _ = d.shape
    if S < 1 or P < 1:
        raise ValueError(f"pooling needs >= 1 seed and >= 1 problem, got {S} and {P}")
    w = resample_weights(
        P, num_resamples, seed
    )  # (B, P): one problem draw per replicate, shared by all seeds
    per_seed_reps = np.stack([w @ x / P for x in d])  # (S, B, K)
    drawn = np.random.default_rng([seed, 1]).integers(0, S, size=(num_resamples, S))  # (B, S) seeds drawn
    pooled_reps = per_seed_reps[drawn, np.arange(num_resamples)[:, None]].mean(axis=1)  # (B, K)
    a = (1.0 - level) / 2
    pooled = CurveCI(d.mean(axis=(0, 1)), *np.quantile(pooled_reps, [a, 1.0 - a], axis=0))
    per_seed = [
        CurveCI(x.mean(axis=0), *np.quantile(r, [a, 1.0 - a], axis=0))
        for x, r in zip(d, per_seed_reps, strict=True)
    ]
    return PooledDifference(
        list(seeds),
        list(ks),
        P,
        pooled,
        per_seed,
        [verdicts(ci.lo, ci.hi) for ci in per_seed],
        verdicts(pooled.lo, pooled.hi),
    )


def paired_over_seeds(
    per_seed: Mapping[str, tuple[Sequence[str], np.ndarray, Sequence[str], np.ndarray]],
    ks: Sequence[int],
    *,
    num_resamples: int = 1000,
    seed: int = 0,
    level: float = 0.95,
) -> tuple[PooledDifference, dict[str, int]]:
    """`pooled_difference` from each seed's (base ids, base (P_s, K), other ids, other (P_s, K)) per-problem
    values, on the problems both models have in every seed, over the first len(ks) columns. Returns the pooled
    difference and, per seed, how many of its problems were left out for lacking a partner somewhere."""
    if not per_seed:
        raise ValueError("pooling over seeds needs at least one seed")
    K = len(ks)
    ids = sorted(set.intersection(*(set(a) & set(b) for a, _, b, _ in per_seed.values())))
    if not ids:
        raise ValueError(f"no problem is shared by both models in every seed ({', '.join(per_seed)})")
    diffs, dropped = [], {}
    for s, (ia, va, ib, vb) in per_seed.items():
        both, xa, xb = align(ia, va[:, :K], ib, vb[:, :K])
        pos = {p: i for i, p in enumerate(both)}
        rows = [pos[p] for p in ids]
        if xa.shape[1] < K:
            raise ValueError(f"seed {s}: {xa.shape[1]} ks of pass@k, {K} asked")
        diffs.append(xb[rows] - xa[rows])
        dropped[s] = len(set(ia) | set(ib)) - len(ids)
    return (
        pooled_difference(
            np.stack(diffs), list(per_seed), ks, num_resamples=num_resamples, seed=seed, level=level
        ),
        dropped,
    )
