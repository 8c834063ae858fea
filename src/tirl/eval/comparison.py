"""Each model against its baseline, on the problems both have: the paired difference of their pass@k curves at
each k, the crossover k (where the one behind at k = 1 overtakes) with its bootstrap interval, the solvable sets,
and the one-line finding a reader can quote.

Models are compared at each shared temperature (else each one's first), and, when either has several, envelope
against envelope, labelled an upper bound (`UPPER_BOUND`); the envelope's solvable sets pool its temperatures
("solved at any temperature").

Not here: each model's own curves (`tirl.eval.accuracy`), the paired bootstrap (`tirl.eval.bootstrap`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tirl.eval.bootstrap import crossover_index, crossover_interval, paired_difference, resample_weights
from tirl.eval.tables import AnalysisConfig

UPPER_BOUND = "best T per k on the test set (envelope, an upper bound)"


def compare(
    base: str,
    other: str,
    a: tuple[np.ndarray, list[str], np.ndarray],
    b: tuple[np.ndarray, list[str], np.ndarray],
    condition: str,
    cfg: AnalysisConfig,
) -> dict:
    """Paired comparison of two models: a and b are (per-problem pass@k (P, n), ids, correct counts (P,))."""
    (pa, ids_a, ca), (pb, ids_b, cb) = a, b
    common = sorted(set(ids_a) & set(ids_b))
    if not common:
        return {
            "base": base,
            "other": other,
            "condition": condition,
            "num_problems": 0,
            "note": "no shared problems",
        }
    ia = {pid: i for i, pid in enumerate(ids_a)}
    ib = {pid: i for i, pid in enumerate(ids_b)}
    ra, rb = [ia[p] for p in common], [ib[p] for p in common]
    n = min(pa.shape[1], pb.shape[1])
    xa, xb = pa[ra, :n], pb[rb, :n]
    w = resample_weights(len(common), cfg.num_resamples, cfg.seed + 1)
    diff, share_better, reps = paired_difference(xa, xb, w, level=cfg.level)
    ks = np.arange(1, n + 1)
    sign = float(np.sign(diff.mean[0]))
    idx = crossover_index(diff.mean)
    ahead = other if sign > 0 else base if sign < 0 else None
    crossover = {"k": None if idx is None else int(ks[idx]), "ahead_at_k1": ahead}
    if sign != 0:
        crossover["interval"] = crossover_interval(reps, sign, ks, level=cfg.level)
    sa, sb = ca[ra] > 0, cb[rb] > 0
    sets = {
        "base_only": [p for p, x, y in zip(common, sa, sb, strict=True) if x and not y],
        "other_only": [p for p, x, y in zip(common, sa, sb, strict=True) if y and not x],
        "both": [p for p, x, y in zip(common, sa, sb, strict=True) if x and y],
        "neither": [p for p, x, y in zip(common, sa, sb, strict=True) if not x and not y],
    }
    return {
        "base": base,
        "other": other,
        "condition": condition,
        "num_problems": len(common),
        "dropped": {base: len(ids_a) - len(common), other: len(ids_b) - len(common)},
        "n": n,
        "ks": ks.tolist(),
        "diff": diff.to_dict(),
        "share_other_better": share_better.tolist(),
        "crossover": crossover,
        "solvable": {**{f"{k}_count": len(v) for k, v in sets.items()}, **sets},
    }


def crossover_sentence(c: dict) -> str:
    """One line a reader can quote: who leads at k = 1 and where (if anywhere within n) the curves meet."""
    if not c.get("num_problems"):
        return f"{c['base']} vs {c['other']} ({c['condition']}): no shared problems"
    x = c["crossover"]
    where = f"{c['base']} vs {c['other']} ({c['condition']}, {c['num_problems']} problems, n={c['n']})"
    # "catches up" means strictly overtakes: ties (both curves saturated at 1) are not a crossover
    if x["ahead_at_k1"] is None:
        return f"{where}: equal at k=1"
    behind = c["base"] if x["ahead_at_k1"] == c["other"] else c["other"]
    iv = x.get("interval", {})
    bound = {None: f">{c['n']}"}
    lo, hi = iv.get("lo"), iv.get("hi")
    ci = f"{bound.get(lo, lo and int(lo))}..{bound.get(hi, hi and int(hi))}"
    share = iv.get("share_with_crossover", 0.0)
    if x["k"] is None:
        return (
            f"{where}: {x['ahead_at_k1']} leads at k=1 and stays ahead up to k={c['n']} (no crossover; "
            f"{100 * share:.0f}% of bootstrap replicates cross, 95% interval {ci})"
        )
    return (
        f"{where}: {x['ahead_at_k1']} leads at k=1; {behind} overtakes it at k={x['k']} "
        f"(bootstrap interval {ci}; {100 * share:.0f}% of replicates cross within n)"
    )


def conditions(temps_a: Sequence[str], temps_b: Sequence[str]) -> list[tuple[str, str, str]]:
    """(name, base key, other key) to compare: each shared temperature (else each model's first one), plus the
    envelope when either model has several temperatures."""
    shared = sorted(set(temps_a) & set(temps_b))
    pairs = [(f"T={t}", t, t) for t in shared] or [
        (f"T={temps_a[0]} vs T={temps_b[0]}", temps_a[0], temps_b[0])
    ]
    if len(temps_a) > 1 or len(temps_b) > 1:
        env_a = "envelope" if len(temps_a) > 1 else temps_a[0]
        env_b = "envelope" if len(temps_b) > 1 else temps_b[0]
        pairs.append((UPPER_BOUND, env_a, env_b))
    return pairs
