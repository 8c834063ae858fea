"""The numbers of a comparison, from each arm's `SeedResult`s: per arm, every metric's mean and [min, max] over
seeds, its pass@k curve and training curves (mean and band over seeds); per arm against the baseline, the paired
difference of each per-problem metric with a 95% interval, and one line saying what holds.

The interval is `tirl demo --seeds`' (`tirl.demo.seeds.lift_interval`): a two-level bootstrap, seeds and then
problems within each drawn seed, on the per-problem difference arm - baseline. Paired: in a seed, both arms
answered the same held-out problems (an arm with other data is paired on the problems both have). Seeded, so the
same results give the same interval. Pure: no files; `results` reads them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tirl.demo.ablation.results import SeedResult
from tirl.demo.seeds import RESAMPLES, lift_interval

LEVEL = 0.95
HEADLINE = "pass@1"  # the metric each comparison's line is about
TAIL_STEPS = 5  # a training series' end value: the mean of its last steps (one step's value is noisy)


def spread(values: Sequence[float]) -> dict[str, float]:
    return {"mean": float(np.mean(values)), "min": float(min(values)), "max": float(max(values))}


def _band(points: Sequence[Mapping[int, float]]) -> dict[str, list]:
    """Per step logged by any seed: mean, min and max over the seeds that logged it, and how many did."""
    steps = sorted(set().union(*points))
    cols = [[p[s] for p in points if s in p] for s in steps]
    return {
        "step": steps,
        "mean": [float(np.mean(c)) for c in cols],
        "min": [float(min(c)) for c in cols],
        "max": [float(max(c)) for c in cols],
        "seeds": [len(c) for c in cols],
    }


def _end(series: Mapping[int, float]) -> float:
    return float(np.mean([series[s] for s in sorted(series)[-TAIL_STEPS:]]))


def arm_summary(results: Sequence[SeedResult]) -> dict[str, Any]:
    """One arm over its finished seeds: metrics (with each training series' end value), pass@k, training bands."""
    metrics: dict[str, list[float]] = {}
    for r in results:
        values = {**r.metrics, **{f"{k} (end)": _end(v) for k, v in r.training.items() if v}}
        for name, value in values.items():
            metrics.setdefault(name, []).append(value)
    ks = sorted(int(m.split("@")[1]) for m in results[0].per_problem if m.startswith("pass@"))
    curves = [[float(np.mean(list(r.per_problem[f"pass@{k}"].values()))) for k in ks] for r in results]
    series = sorted({name for r in results for name in r.training})
    return {
        "seeds": [r.seed for r in results],
        "metrics": {name: spread(v) for name, v in metrics.items() if len(v) == len(results)},
        "pass@k": {"ks": ks, **{key: list(vals) for key, vals in _curve_spread(curves).items()}},
        "training": {
            name: _band([r.training[name] for r in results if name in r.training]) for name in series
        },
    }


def _curve_spread(curves: list[list[float]]) -> dict[str, np.ndarray]:
    arr = np.array(curves)  # (seeds, K)
    return {
        "mean": arr.mean(axis=0).tolist(),
        "min": arr.min(axis=0).tolist(),
        "max": arr.max(axis=0).tolist(),
    }


def paired(base: Sequence[SeedResult], other: Sequence[SeedResult]) -> dict[str, Any]:
    """other - base per problem, seed by seed (the seeds both finished), and its interval for every metric both
    have per problem."""
    by_seed = {r.seed: r for r in base}
    pairs = [(by_seed[r.seed], r) for r in other if r.seed in by_seed]
    out: dict[str, Any] = {"seeds": [o.seed for _, o in pairs], "metrics": {}}
    if not pairs:
        return out
    names = [
        m for m in pairs[0][0].per_problem if all(m in b.per_problem and m in o.per_problem for b, o in pairs)
    ]
    for name in names:
        diffs = []
        for b, o in pairs:
            common = sorted(b.per_problem[name].keys() & o.per_problem[name].keys())
            diffs.append(np.array([o.per_problem[name][p] - b.per_problem[name][p] for p in common]))
        if any(len(d) == 0 for d in diffs):
            continue
        mean, lo, hi = lift_interval(diffs, level=LEVEL)
        out["metrics"][name] = {"mean": mean, "lo": lo, "hi": hi, "problems": [len(d) for d in diffs]}
    out["level"], out["resamples"] = LEVEL, RESAMPLES
    return out


def _direction(d: Mapping[str, float]) -> int:
    return 1 if d["lo"] > 0 else -1 if d["hi"] < 0 else 0


def verdict(arm: str, baseline: str, diff: Mapping[str, Any], expect: int | None) -> dict[str, Any]:
    """What holds for `arm` against `baseline` on the headline metric: the line, the direction the interval shows
    (+1, -1, or 0 when it holds 0) and, with a claim (`expect`), whether it holds, is contradicted or not shown."""
    d = diff["metrics"].get(HEADLINE)
    if d is None:
        return {
            "direction": None,
            "claim": None,
            "line": f"{arm} vs {baseline}: no paired {HEADLINE} (no seed both finished)",
        }
    direction = _direction(d)
    seeds, problems = len(diff["seeds"]), min(d["problems"])
    shown = {1: f"{arm} is higher", -1: f"{arm} is lower", 0: "no difference shown (the interval holds 0)"}[
        direction
    ]
    line = (
        f"{arm} vs {baseline}: {HEADLINE} {100 * d['mean']:+.1f} points, {LEVEL:.0%} interval "
        f"[{100 * d['lo']:+.1f}, {100 * d['hi']:+.1f}] ({seeds} seed{'s' * (seeds > 1)} x {problems} problems, "
        f"paired): {shown}"
    )
    claim = None
    if expect:
        claim = "holds" if direction == expect else "not shown" if direction == 0 else "contradicted"
        line += f"; the claim that {arm} is {'higher' if expect > 0 else 'lower'}: {claim}"
    return {"direction": direction, "claim": claim, "line": line}


def summarize(
    results: Mapping[str, Sequence[SeedResult]], baseline: str, expect: Mapping[str, int] | None = None
) -> dict[str, Any]:
    """Per-arm summaries of the arms with a finished seed, and each such arm against the baseline."""
    expect = expect or {}
    arms = {a: arm_summary(rs) for a, rs in results.items() if rs}
    comparisons = []
    for arm, rs in results.items():
        if arm == baseline or not rs or not results.get(baseline):
            continue
        diff = paired(results[baseline], rs)
        comparisons.append(
            {"arm": arm, "baseline": baseline, **diff, **verdict(arm, baseline, diff, expect.get(arm))}
        )
    return {"arms": arms, "comparisons": comparisons}
