"""The comparison behind `tirl analyze`: every number of the report, from loaded runs, as one JSON-ready dict.

Per data source and per model (and temperature): avg@n, pass@k for every k in 1..n, maj@k at k = 1, 2, 4, ..., n
(answers grouped by the verifier's equivalence), Cover@tau, the per-problem accuracy histogram, each curve with a
bootstrap interval over problems. With several temperatures, the best temperature per k and the envelope curve.
For each model against the first (the baseline), on the problems both have: the paired difference at each k,
the crossover k with its bootstrap interval, and the solvable sets. Per model: tool-use statistics split by
correct / incorrect, the lucky-guess audit of correct answers, and the reasoning mode: accuracy by tool calls per
answer and whether correct answers make fewer calls than wrong ones on the same problem (`reasoning_mode`).

Choices worth knowing: the envelope picks each k's best temperature on the full data and then bootstraps with
that choice fixed (so its interval ignores the selection; it is optimistic by construction, labelled an upper
bound; temperatures chosen on a validation slice are `tirl.eval.selection`'s). Samples of
different temperatures are never pooled into one pass@k; the envelope comparison's solvable sets pool them
("solved at any temperature").

A counts-only run (tirl.eval.counts) gives each problem c correct then n - c wrong grades: pass@k, Cover@tau, the
histogram, the envelope and the comparisons need only n and c. What needs the samples (maj@k and verl's bootstrap
estimators need the answers; tool use, the reasoning mode and the audit the responses) is skipped for it, never
computed from the placeholder grades: its model blocks list them under "skipped", its run carries a note.
"""

from __future__ import annotations

import datetime
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from tirl.core.config import MAX_COUNT
from tirl.eval import audit
from tirl.eval.answers import canonical_answers
from tirl.eval.bootstrap import (
    bootstrap_curve,
    crossover_index,
    crossover_interval,
    paired_difference,
    resample_weights,
)
from tirl.eval.counts import count_groups, temperature_key
from tirl.eval.metrics import default_ks, maj_at_k, pass_at_k_table
from tirl.eval.reasoning_mode import reasoning_mode
from tirl.eval.samples import Run, Sample
from tirl.eval.verl_metrics import bootstrap_summary
from tirl.rollout.agent.toolstats import tool_stats


@dataclass
class AnalysisConfig:
    num_resamples: int = 1000  # bootstrap replicates over problems
    seed: int = 0
    level: float = 0.95  # interval coverage
    taus: list[float] = field(default_factory=lambda: [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0])
    maj_exact_limit: int = 20000  # enumerate k-subsets up to this many, else Monte Carlo
    maj_samples: int = 500  # Monte Carlo subsets per problem and k
    max_examples: int = 5  # audit examples kept per model

    def __post_init__(self) -> None:
        if not 10 <= self.num_resamples <= MAX_COUNT:  # replicates x problems are held at once
            raise ValueError(f"num_resamples (--bootstrap) must be 10-{MAX_COUNT}, got {self.num_resamples}")
        if not 0.5 < self.level < 1.0:
            raise ValueError(f"level must lie in (0.5, 1), got {self.level}")
        if not self.taus or any(not 0.0 < t <= 1.0 for t in self.taus):
            raise ValueError(f"taus must lie in (0, 1], got {self.taus}")


@dataclass
class Table:
    """One model's samples on one data source at one temperature: (P, n) grades, answers per problem (None for a
    counts-only run, whose grades are c correct then n - c wrong: they cannot be cut to fewer samples)."""

    ids: list[str]
    correct: np.ndarray  # (P, n) bool
    answers: list[list[str | None]] | None

    @property
    def n(self) -> int:
        return self.correct.shape[1]

    def subset(self, ids: Sequence[str], n: int) -> Table:
        pos = {pid: i for i, pid in enumerate(self.ids)}
        rows = [pos[pid] for pid in ids]
        if self.answers is None:
            if n < self.n:  # the first n of c-then-wrong grades are not a sample of them
                raise ValueError(f"counts-only grades (n={self.n}) cannot be cut to {n} samples")
            return Table(list(ids), self.correct[rows], None)
        return Table(list(ids), self.correct[rows, :n], [self.answers[r][:n] for r in rows])


def build_tables(run: Run) -> dict[str, dict[str, Table]]:
    """source -> temperature key -> Table; every problem must have the same number of samples."""
    if run.counts is not None:
        tables: dict[str, dict[str, Table]] = defaultdict(dict)
        for (source, tkey), (ids, n, c) in count_groups(run.counts, run.path).items():
            tables[source][tkey] = Table(ids, np.arange(n)[None, :] < c[:, None], None)  # (P, n)
        return tables
    groups: dict[tuple[str, str], dict[str, list[Sample]]] = defaultdict(lambda: defaultdict(list))
    for s in run.samples:
        r = s.record
        groups[(r.data_source, temperature_key(r.temperature))][r.problem_id].append(s)
    out: dict[str, dict[str, Table]] = defaultdict(dict)
    for (source, tkey), problems in sorted(groups.items()):
        sizes = {pid: len(v) for pid, v in problems.items()}
        n = Counter(sizes.values()).most_common(1)[0][0]
        if len(set(sizes.values())) > 1:
            odd = next(pid for pid, m in sizes.items() if m != n)
            raise ValueError(
                f"{run.path}: model {run.label!r}, source {source!r}, T={tkey}: problems have different sample "
                f"counts (most have {n}; problem {odd!r} has {sizes[odd]}); pass@k needs one n per problem"
            )
        ids = sorted(problems)
        ordered = [sorted(problems[pid], key=lambda s: s.record.sample_index) for pid in ids]
        correct = np.array([[s.record.correct for s in ss] for ss in ordered], dtype=bool)
        out[source][tkey] = Table(ids, correct, [[s.record.pred for s in ss] for ss in ordered])
    return out


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


def audit_block(samples: Sequence[Sample], cfg: AnalysisConfig) -> dict:
    """Among correct answers with text: share with >= 1 false arithmetic statement, examples, answer source."""
    correct = [s for s in samples if s.record.correct and (s.reasoning or s.raw_output)]
    with_false, checked, statements = 0, 0, 0
    examples = []
    sources = {"tool": 0, "text": 0, "n/a": 0}
    for s in correct:
        found = audit.find_statements(s.reasoning)
        statements += len(found)
        checked += bool(found)
        false = [st for st in found if not st.true]
        if false:
            with_false += 1
            if len(examples) < cfg.max_examples:
                st = false[0]
                examples.append(
                    {
                        "problem_id": s.record.problem_id,
                        "sample_index": s.record.sample_index,
                        "statement": st.text,
                        "values": [str(v) for v in st.values],
                        "answer": s.record.pred,
                    }
                )
        sources[audit.answer_source(s.record.pred, s.tool_outputs)] += 1
    m = max(1, len(correct))
    return {
        "correct_answers": len(correct),
        "with_statements": checked,
        "statements": statements,
        "with_false_statement": with_false,
        "false_share": with_false / m,
        "examples": examples,
        "answer_source": {k: v / m for k, v in sources.items()},
    }


def tool_block(samples: Sequence[Sample]) -> dict[str, float]:
    return tool_stats([s.record for s in samples], [s.record.correct for s in samples])


Curves = tuple[
    np.ndarray, list[str], np.ndarray
]  # per-problem pass@k (P, n), problem ids, correct counts (P,)


def _model_entry(
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


UPPER_BOUND = "best T per k on the test set (envelope, an upper bound)"


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


def _source_entry(
    source: str,
    tables: dict[str, dict[str, dict[str, Table]]],
    labels: list[str],
    pairs: list[tuple[str, str]],
    cfg: AnalysisConfig,
) -> dict:
    entry: dict = {"models": {}, "comparisons": []}
    curves: dict[str, dict[str, Curves]] = {}
    for label in labels:
        if tables[label].get(source):
            entry["models"][label], curves[label] = _model_entry(tables[label][source], cfg, source)
    for base, other in pairs:
        if base not in curves or other not in curves:
            continue
        temps_a = [t for t in curves[base] if t != "envelope"]
        temps_b = [t for t in curves[other] if t != "envelope"]
        for name, ta, tb in conditions(temps_a, temps_b):
            entry["comparisons"].append(compare(base, other, curves[base][ta], curves[other][tb], name, cfg))
    return entry


def analyze_runs(
    runs: Sequence[Run], cfg: AnalysisConfig, pairs: list[tuple[str, str]] | None = None
) -> dict:
    """The whole report; runs[0] is the baseline every other run is compared with, unless `pairs` names the
    (base, other) labels to compare (over seeds: each seed's models with the same seed's baseline)."""
    labels = [r.label for r in runs]
    pairs = [(labels[0], other) for other in labels[1:]] if pairs is None else pairs
    if len(set(labels)) != len(labels):
        raise ValueError(
            f"model labels must be distinct, got {labels} (use --labels; --seeds pools runs of a label)"
        )
    tables = {r.label: build_tables(r) for r in runs}
    sources = sorted({s for t in tables.values() for s in t})
    run_meta = [
        {
            "label": r.label,
            "path": r.path,
            "kind": r.kind,
            "samples": r.num_samples,
            "tokenizer": r.tokenizer_path,
            "notes": r.notes,
        }
        for r in runs
    ]
    report: dict = {
        "meta": {
            "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "config": asdict(cfg),
            "runs": run_meta,
            "baseline": labels[0],
        },
        "models": labels,
        "sources": {src: _source_entry(src, tables, labels, pairs, cfg) for src in sources},
    }
    report["findings"] = [
        f"[{src}] {crossover_sentence(c)}" for src, e in report["sources"].items() for c in e["comparisons"]
    ]
    sampled = [r for r in runs if r.counts is None]  # a counts-only run has no samples (its note says so)
    report["tool_use"] = {
        r.label: {
            src: tool_block([s for s in r.samples if s.record.data_source == src])
            for src in sorted({s.record.data_source for s in r.samples})
        }
        for r in sampled
    }
    report["reasoning_mode"] = {  # tool calls per answer against accuracy (`tirl.eval.reasoning_mode`)
        r.label: reasoning_mode(
            [s.record for s in r.samples], num_resamples=cfg.num_resamples, seed=cfg.seed, level=cfg.level
        )  # fmt: skip
        for r in sampled
    }
    report["audit"] = {
        r.label: audit_block(r.samples, cfg)
        for r in sampled
        if any(s.reasoning or s.raw_output for s in r.samples)
    }
    return report
