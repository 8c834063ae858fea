"""One model's accuracy on one data source, as the report shows it: avg@n, pass@k for every k in 1..n, maj@k at
k = 1, 2, 4, ..., n (answers grouped by the verifier's equivalence), Cover@tau, the per-problem accuracy histogram
and verl's bootstrap best@k / maj@k, each curve with a bootstrap interval over problems; with several
temperatures, the best temperature per k and the envelope curve.

The envelope picks each k's best temperature on the full data and then bootstraps with that choice fixed (so its
interval ignores the selection; it is optimistic by construction, labelled an upper bound; temperatures chosen on a
validation slice are `tirl.eval.selection`'s). Samples of different temperatures are never pooled into one pass@k.

Not here: comparing two models (`tirl.eval.comparison`), the estimators themselves (`tirl.eval.metrics`,
`tirl.eval.bootstrap`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tirl.eval.answers import canonical_answers
from tirl.eval.bootstrap import bootstrap_curve, resample_weights
from tirl.eval.metrics import default_ks, maj_at_k, pass_at_k_table
from tirl.eval.tables import AnalysisConfig, Table
from tirl.eval.verl_metrics import bootstrap_summary

# per-problem pass@k (P, n), problem ids, correct counts (P,)
Curves = tuple[np.ndarray, list[str], np.ndarray]


def _histogram(correct_counts: np.ndarray, n: int) -> dict[str, list]:
    rates = correct_counts / n
    if n <= 32:
        return {
            "labels": [f"{c}/{n}" for c in range(n + 1)],
            "counts": np.bincount(correct_counts, minlength=n + 1).tolist(),
        }
    inner = rates[(rates > 0) & (rates < 1)]
    counts, edges = np.histogram(inner, bins=10, range=(0.0, 1.0))
    labels = ["0"] + [f"{a:.1f}-{b:.1f}" for a, b in zip(edges[:-1], edges[1:], strict=True)] + ["1"]
    return {"labels": labels, "counts": [int((rates == 0).sum()), *counts.tolist(), int((rates == 1).sum())]}


def _maj_table(
    table: Table, cfg: AnalysisConfig, source: str | None = None
) -> tuple[list[int], np.ndarray, np.ndarray]:
    """maj@k per problem at k = 1, 2, 4, ..., n: (ks, values (P, K), Monte Carlo standard errors (P, K)); answers
    are grouped by the equivalence of the verifier `source` routes to."""
    ks = default_ks(table.n)
    vals = np.zeros((len(table.ids), len(ks)))
    ses = np.zeros_like(vals)
    for i, answers in enumerate(table.answers):
        canon = canonical_answers(answers, source)
        for j, k in enumerate(ks):
            vals[i, j], ses[i, j] = maj_at_k(
                canon,
                table.correct[i].tolist(),
                k,
                exact_limit=cfg.maj_exact_limit,
                num_samples=cfg.maj_samples,
                seed=cfg.seed + i,
            )
    return ks, vals, ses


def verl_block(table: Table, ks: Sequence[int]) -> dict[str, list]:
    """verl's bootstrap best@k / maj@k (raw answer strings vote), mean over problems, at `ks`: the numbers a
    verl run or paper reports as pass@k / maj@k, for comparison with the unbiased ones (tirl.eval.verl_metrics)."""
    per = [bootstrap_summary(c.tolist(), a, ks) for c, a in zip(table.correct, table.answers, strict=True)]
    mean = lambda key: float(np.mean([p[key] for p in per]))  # noqa: E731
    return {
        "ks": list(ks),
        "best@k": [mean(f"bootstrap_best@{k}") for k in ks],
        "maj@k": [mean(f"bootstrap_maj@{k}") for k in ks],
    }


def model_block(table: Table, cfg: AnalysisConfig, source: str | None = None) -> tuple[dict, np.ndarray]:
    """One model at one temperature on one source: the report entry and the (P, n) per-problem pass@k table."""
    P, n = table.correct.shape
    counts = table.correct.sum(axis=1)
    pk = pass_at_k_table(n, counts)
    w = resample_weights(P, cfg.num_resamples, cfg.seed)
    maj_ks, maj, maj_se = _maj_table(table, cfg, source) if table.answers is not None else ([], None, None)
    taus = np.asarray(cfg.taus)
    cover = (counts[:, None] / n >= taus[None, :] - 1e-12).astype(np.float64)  # (P, len(taus))
    block = {
        "num_problems": P,
        "n": n,
        "avg@n": float(counts.sum() / (P * n)),
        "ks": list(range(1, n + 1)),
        "pass@k": bootstrap_curve(pk, w, level=cfg.level).to_dict(),
        "maj_ks": maj_ks,
        "maj@k": {"mean": [], "lo": [], "hi": [], "mc_stderr": []},
        "cover": {"taus": list(cfg.taus), **bootstrap_curve(cover, w, level=cfg.level).to_dict()},
        "verl_bootstrap": {"ks": [], "best@k": [], "maj@k": []},
        "histogram": _histogram(counts, n),
        "solved_ids": [pid for pid, c in zip(table.ids, counts, strict=True) if c > 0],
    }
    if table.answers is None:  # counts only: empty curves, never ones computed from placeholder answers
        block["skipped"] = ["maj@k", "verl_bootstrap"]
    else:
        block["maj@k"] = {
            **bootstrap_curve(maj, w, level=cfg.level).to_dict(),
            "mc_stderr": (np.sqrt((maj_se**2).sum(axis=0)) / P).tolist(),
        }
        block["verl_bootstrap"] = verl_block(table, maj_ks)
    return block, pk


def envelope(
    tables: dict[str, Table], pks: dict[str, np.ndarray], cfg: AnalysisConfig
) -> tuple[dict, np.ndarray, list[str], np.ndarray]:
    """Best temperature per k and the envelope curve, on the problems every temperature has.

    Returns (report entry, per-problem envelope values (P, n_min), problem ids, per-problem correct counts pooled
    over temperatures).
    """
    common = sorted(set.intersection(*(set(t.ids) for t in tables.values())))
    n = min(t.n for t in tables.values())
    per_t = {}
    for tkey, t in tables.items():
        pos = {pid: i for i, pid in enumerate(t.ids)}
        per_t[tkey] = (
            pks[tkey][[pos[pid] for pid in common], :n]
            if t.n == n or t.answers is None  # counts only: the estimator of its full n (cannot subsample)
            else pass_at_k_table(n, t.subset(common, n).correct.sum(axis=1))
        )
    tkeys = sorted(per_t)
    means = np.stack([per_t[t].mean(axis=0) for t in tkeys])  # (T, n)
    best = means.argmax(axis=0)  # (n,)
    values = np.stack([per_t[tkeys[b]][:, j] for j, b in enumerate(best)], axis=1)  # (P, n)
    w = resample_weights(len(common), cfg.num_resamples, cfg.seed)
    pooled = sum(tables[t].subset(common, tables[t].n).correct.sum(axis=1) for t in tkeys)
    entry = {
        "num_problems": len(common),
        "n": n,
        "ks": list(range(1, n + 1)),
        "temperatures": tkeys,
        "note": "each k's temperature chosen on these same problems: an upper bound, never a verdict",
        "best_temperature": [tkeys[b] for b in best],
        "pass@k": bootstrap_curve(values, w, level=cfg.level).to_dict(),
    }
    return entry, values, common, np.asarray(pooled)


def model_entry(
    by_t: dict[str, Table], cfg: AnalysisConfig, source: str | None = None
) -> tuple[dict, dict[str, Curves]]:
    """One model on one source: its report entry, and its curves per temperature key (and "envelope")."""
    blocks, pks = {}, {}
    for tkey, t in by_t.items():
        blocks[tkey], pks[tkey] = model_block(t, cfg, source)
    entry: dict = {"temperatures": blocks}
    curves = {tkey: (pks[tkey], by_t[tkey].ids, by_t[tkey].correct.sum(axis=1)) for tkey in by_t}
    if len(by_t) > 1:
        env, values, ids, pooled = envelope(by_t, pks, cfg)
        entry["envelope"] = env
        curves["envelope"] = (values, ids, pooled)
    return entry, curves
