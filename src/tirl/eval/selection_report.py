"""The report sections of `tirl analyze --choose-temperature-on VAL,... --seeds S,...`: temperatures chosen on
validation runs, and differences pooled over seeds, from loaded runs; as report.json entries, findings and HTML.

`plan_runs` turns the command's runs into what the analysis compares: without seeds, each run is a model and every
model is compared with the first; with seeds, the runs of one label and one seed are one model, named
"<label> seed <s>" (several runs of it, e.g. one evaluation per temperature, are merged; two holding the same
source and temperature are an error), and each seed's models are compared with the same seed's baseline, never
across seeds (a seed is one chain: SFT, filter, RL). Each run may have a validation run (an evaluation of the
validation slice, at a grid of temperatures) on which its temperature per k is chosen.

The math is `tirl.eval.selection`; this module only gathers its counts from the runs and lays out its results.
Not here: plots of these sections (the numbers are in report.json and report.html).
"""

from __future__ import annotations

import dataclasses
import html
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tirl.eval.metrics import default_ks
from tirl.eval.samples import Run
from tirl.eval.selection import (
    ChosenCurve,
    Counts,
    choose_temperatures,
    curve_at_chosen,
    missing_temperatures,
    paired_at_chosen,
    paired_over_seeds,
    pass_at_ks,
)
from tirl.eval.tables import AnalysisConfig, Table, build_tables

CHOSEN = "validation-chosen T"
SEED_WORD = " seed "


@dataclass
class Plan:
    """Runs as the analysis compares them."""

    runs: list[Run]  # one per model (and seed); labels distinct
    pairs: list[tuple[str, str]]  # (base label, other label) to compare
    validation: dict[str, Run] = field(default_factory=dict)  # run label -> its validation run
    seeds: dict[str, tuple[str, str]] = field(default_factory=dict)  # run label -> (model label, seed)


def _merge(runs: list[Run], label: str) -> Run:
    """One model from its runs (each holding other temperatures or sources); the same path given twice counts once."""
    unique = list({str(Path(r.path).resolve()): r for r in runs}.values())
    if len(unique) == 1:
        for s in unique[0].samples:
            s.record.model = label
        return dataclasses.replace(unique[0], label=label)
    if len({r.counts is None for r in unique}) > 1:
        raise ValueError(
            f"{label}: cannot merge a counts file with sampled runs ({', '.join(r.path for r in unique)})"
        )
    held: dict[tuple[str, str], str] = {}
    for r in unique:
        for source, by_t in build_tables(r).items():
            for tkey in by_t:
                if (source, tkey) in held:
                    raise ValueError(
                        f"{label}: runs {held[source, tkey]} and {r.path} both hold source {source!r} at T={tkey}; "
                        "give each label and seed one evaluation per temperature"
                    )
                held[source, tkey] = r.path
    samples = [s for r in unique for s in r.samples]
    for s in samples:
        s.record.model = label
    counts = None if unique[0].counts is None else [c for r in unique for c in r.counts or []]
    tokenizer = next((r.tokenizer_path for r in unique if r.tokenizer_path), None)
    notes = [n for r in unique for n in r.notes]
    return Run(
        label, " + ".join(r.path for r in unique), unique[0].kind, samples, tokenizer, notes, counts=counts
    )


def plan_runs(runs: list[Run], validation: list[Run] | None = None, seeds: list[str] | None = None) -> Plan:
    """The models, their validation runs and the pairs to compare (module docstring); runs[0] is the baseline."""
    if validation is not None and len(validation) != len(runs):
        raise ValueError(
            f"--choose-temperature-on gives {len(validation)} validation runs for {len(runs)} runs"
        )
    if seeds is not None and len(seeds) != len(runs):
        raise ValueError(f"--seeds gives {len(seeds)} seeds for {len(runs)} runs")
    for r, v in zip(runs, validation or [], strict=False):
        if Path(r.path).resolve() == Path(v.path).resolve():
            raise ValueError(
                f"{v.path} is both a test run and its validation run: choose on a validation slice"
            )
    if seeds is None:
        labels = [r.label for r in runs]
        val = {r.label: v for r, v in zip(runs, validation, strict=True)} if validation else {}
        return Plan(list(runs), [(labels[0], o) for o in labels[1:]], val)
    base = runs[0].label
    others = list(dict.fromkeys(r.label for r in runs if r.label != base))
    groups: dict[tuple[str, str], list[int]] = {}
    for i, (r, s) in enumerate(zip(runs, seeds, strict=True)):
        groups.setdefault((r.label, s), []).append(i)
    name = {key: f"{key[0]}{SEED_WORD}{key[1]}" for key in groups}
    merged = [_merge([runs[i] for i in idx], name[key]) for key, idx in groups.items()]
    val = {}
    if validation:
        val = {name[key]: _merge([validation[i] for i in idx], name[key]) for key, idx in groups.items()}
    pairs = [(name[base, s], name[o, s]) for o in others for b, s in groups if b == base and (o, s) in groups]
    return Plan(merged, pairs, val, {name[key]: key for key in groups})


def _table_counts(table: Table) -> Counts:
    return Counts(table.ids, table.correct.sum(axis=1), table.n)


def _counts(by_t: dict[str, Table]) -> dict[float, Counts]:
    """Temperature -> counts; a run that does not record its temperature (verl dumps: "unknown") is left out."""
    return {float(t): _table_counts(tb) for t, tb in by_t.items() if t != "unknown"}


def _validation_tables(val: Run, tables: dict[str, dict[str, Table]], source: str) -> tuple[str, dict]:
    """The validation run's tables for a test source: the same source, or the run's only one."""
    name = source if source in tables else next(iter(tables)) if len(tables) == 1 else None
    if name is None:
        raise ValueError(f"validation run {val.path} has no data source {source!r} (it has {sorted(tables)})")
    if "unknown" in tables[name] or not tables[name]:
        raise ValueError(
            f"validation run {val.path} does not record its temperatures: no temperature to choose"
        )
    return name, tables[name]


def _chosen_model(
    test_by_t: dict[str, Table], val: Run, val_tables: dict, source: str, cfg: AnalysisConfig
) -> tuple[dict, ChosenCurve | None]:
    vsrc, val_by_t = _validation_tables(val, val_tables, source)
    val_counts = _counts(val_by_t)
    max_k = min(int(c.n.min()) for c in val_counts.values())
    choice = choose_temperatures(val_counts, range(1, max_k + 1))
    test = _counts(test_by_t)
    val_ids = {p for c in val_counts.values() for p in c.ids}
    test_ids = {p for c in test.values() for p in c.ids}
    entry = {"validation": val.path, "validation_source": vsrc, **choice.to_dict()}
    entry["shared_with_test"] = len(val_ids & test_ids)  # > 0: the choice saw test problems
    missing = missing_temperatures(test, choice)
    if missing:
        entry["test"] = None
        entry["missing"] = {f"{t:g}": ks for t, ks in sorted(missing.items())}
        return entry, None
    curve = curve_at_chosen(test, choice, num_resamples=cfg.num_resamples, seed=cfg.seed, level=cfg.level)
    entry["test"] = curve.to_dict()
    return entry, curve


def chosen_section(
    plan: Plan, tables: dict[str, dict[str, dict[str, Table]]], cfg: AnalysisConfig
) -> tuple[dict, dict[str, dict[str, ChosenCurve]]]:
    """source -> {"models": label -> choice and test curve, "comparisons": [...]}, and the curves by source and
    label (for pooling over seeds)."""
    section: dict[str, dict] = {}
    curves: dict[str, dict[str, ChosenCurve]] = {}
    for run in plan.runs:
        val = plan.validation[run.label]
        val_tables = build_tables(val)
        for source, by_t in tables[run.label].items():
            entry, curve = _chosen_model(by_t, val, val_tables, source, cfg)
            section.setdefault(source, {"models": {}, "comparisons": []})["models"][run.label] = entry
            if curve is not None:
                curves.setdefault(source, {})[run.label] = curve
    for source, sec in section.items():
        for base, other in plan.pairs:
            a, b = curves.get(source, {}).get(base), curves.get(source, {}).get(other)
            if base not in sec["models"] or other not in sec["models"]:
                continue
            c = {"base": base, "other": other, "condition": CHOSEN}
            if a is None or b is None:
                c["note"] = "no test curve at the chosen temperatures (see `missing`)"
            else:
                pd = paired_at_chosen(
                    a, b, num_resamples=cfg.num_resamples, seed=cfg.seed + 1, level=cfg.level
                )
                k = len(pd.ks)
                c.update(pd.to_dict(), chosen={base: a.chosen[:k], other: b.chosen[:k]})
            sec["comparisons"].append(c)
    return section, curves


def _seed_conditions(
    runs: list[str], by_run: dict[str, dict[str, Table]], chosen: dict[str, ChosenCurve]
) -> list[tuple[str, dict[str, tuple[list[str], np.ndarray]]]]:
    """(condition, run label -> (ids, per-problem pass@k (P, K))) for each test temperature every run has, and
    for the validation-chosen temperatures when every run has its curve; K is the smallest n among them."""
    out = []
    shared = set.intersection(*(set(by_run[r]) for r in runs))
    for tkey in sorted(shared, key=lambda t: (t == "unknown", float(t) if t != "unknown" else 0.0)):
        k = min(by_run[r][tkey].n for r in runs)
        values = {r: pass_at_ks(_table_counts(by_run[r][tkey]), range(1, k + 1)) for r in runs}
        out.append((f"T={tkey}", {r: (by_run[r][tkey].ids, values[r]) for r in runs}))
    if chosen and all(r in chosen for r in runs):
        k = min(len(chosen[r].ks) for r in runs)
        out.append((CHOSEN, {r: (chosen[r].ids, chosen[r].values[:, :k]) for r in runs}))
    return out


def seeds_section(
    plan: Plan,
    tables: dict[str, dict[str, dict[str, Table]]],
    chosen: dict[str, dict[str, ChosenCurve]],
    cfg: AnalysisConfig,
) -> dict:
    """source -> [one entry per (base model, other model) and condition: pooled over the seeds both have]."""
    by_models: dict[tuple[str, str], list[tuple[str, str, str]]] = {}
    for base, other in plan.pairs:
        (mb, seed), (mo, _) = plan.seeds[base], plan.seeds[other]
        by_models.setdefault((mb, mo), []).append((seed, base, other))
    out: dict[str, list] = {}
    sources = sorted({s for t in tables.values() for s in t})
    for source in sources:
        for (mb, mo), seeds in by_models.items():
            seeds = [x for x in seeds if source in tables[x[1]] and source in tables[x[2]]]
            if not seeds:
                continue
            runs = [r for _, b, o in seeds for r in (b, o)]
            by_run = {r: tables[r][source] for r in runs}
            conditions = _seed_conditions(runs, by_run, chosen.get(source, {}))
            if not conditions:
                note = (
                    "no test temperature is shared by every run of the pair, and no validation-chosen curve"
                )
                out.setdefault(source, []).append(
                    {"base": mb, "other": mo, "seeds": [x[0] for x in seeds], "note": note}
                )
            for cond, values in conditions:
                per_seed = {s: (*values[b], *values[o]) for s, b, o in seeds}
                ks = list(range(1, min(v[1].shape[1] for v in values.values()) + 1))
                pooled, dropped = paired_over_seeds(
                    per_seed, ks, num_resamples=cfg.num_resamples, seed=cfg.seed + 2, level=cfg.level
                )
                out.setdefault(source, []).append(
                    {"base": mb, "other": mo, "condition": cond, **pooled.to_dict(), "dropped": dropped}
                )
    return out


def add_sections(report: dict, plan: Plan, cfg: AnalysisConfig) -> None:
    """report["validation_chosen"] (when the runs have validation runs), report["seeds"] (when pooled over
    seeds), and their findings."""
    if not plan.validation and not plan.seeds:
        return
    tables = {r.label: build_tables(r) for r in plan.runs}
    chosen: dict[str, dict[str, ChosenCurve]] = {}
    if plan.validation:
        report["validation_chosen"], chosen = chosen_section(plan, tables, cfg)
    if plan.seeds:
        report["seeds"] = seeds_section(plan, tables, chosen, cfg)
    report["findings"] += findings(report)


def _pts(x: float) -> str:
    return f"{100 * x:+.1f}"


def _spans(ks: list[int], temps: list[float]) -> str:
    """ "T=0.6 at k=1..4, T=1 at k=5..64": the chosen temperature over runs of k."""
    parts, start = [], 0
    for j in range(1, len(ks) + 1):
        if j == len(ks) or temps[j] != temps[start]:
            span = f"k={ks[start]}" if j - 1 == start else f"k={ks[start]}..{ks[j - 1]}"
            parts.append(f"T={temps[start]:g} at {span}")
            start = j
    return ", ".join(parts)


def _diff_at(c: dict, j: int, curve: str = "diff") -> str:
    d = c[curve]
    return f"k={c['ks'][j]} {_pts(d['mean'][j])} [{_pts(d['lo'][j])}, {_pts(d['hi'][j])}] ({c['verdict'][j]})"


def findings(report: dict) -> list[str]:
    """One line per model's choice, per comparison at the chosen temperatures, per pooled comparison."""
    lines = []
    for src, sec in report.get("validation_chosen", {}).items():
        for label, m in sec["models"].items():
            edge = ""
            if m["edge_ks"]:
                edge = (
                    f"; at the grid's edge ({m['temperatures'][0]:g} or {m['temperatures'][-1]:g}) for "
                    f"{len(m['edge_ks'])} of {len(m['ks'])} ks: the grid may be too narrow"
                )
            shared = (
                f"; {m['shared_with_test']} validation problems are test problems"
                if m["shared_with_test"]
                else ""
            )
            lines.append(
                f"[{src}] {label}: validation chose {_spans(m['ks'], m['chosen_temperature'])} "
                f"({m['num_problems']} validation problems){edge}{shared}"
            )
            if m["test"] is None:
                lines.append(f"[{src}] {label}: the test runs lack the chosen T={', '.join(m['missing'])}")
        for c in sec["comparisons"]:
            if "diff" in c:
                at = "; ".join(_diff_at(c, j) for j in sorted({0, len(c["ks"]) - 1}))
                lines.append(
                    f"[{src}] {c['other']} - {c['base']} at {CHOSEN} ({c['num_problems']} problems): {at}"
                )
    for src, entries in report.get("seeds", {}).items():
        for c in entries:
            S = len(c["seeds"])
            if "note" in c:
                lines.append(
                    f"[{src}] {c['other']} - {c['base']} over seeds {', '.join(c['seeds'])}: {c['note']}"
                )
                continue
            at = "; ".join(
                f"{_diff_at(c, j, 'pooled')}, holds in {c['holds_in'][j]} of {S} seeds"
                for j in sorted({0, len(c["ks"]) - 1})
            )
            lines.append(
                f"[{src}] {c['other']} - {c['base']} over seeds {', '.join(c['seeds'])} ({c['condition']}, "
                f"{c['num_problems']} problems, pooled): {at}"
            )
    return lines


def _e(x: object) -> str:
    return html.escape(str(x))


def _table(head: list[str], rows: list[list[str]]) -> str:
    h = "".join(f"<th>{_e(c)}</th>" for c in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><tr>{h}</tr>{body}</table>"


def _ci(d: dict, j: int, fmt: Callable[[float], str] = _pts) -> str:
    return f"{fmt(d['mean'][j])} <small>[{fmt(d['lo'][j])}, {fmt(d['hi'][j])}]</small>"


def _chosen_html(sec: dict) -> str:
    parts = []
    for label, m in sec["models"].items():
        test = m["test"]
        rows = []
        for k in default_ks(len(m["ks"])):
            j = k - 1
            t = m["chosen_temperature"][j]
            cell = _ci(test["pass@k"], j, lambda x: f"{100 * x:.1f}") if test and j < len(test["ks"]) else "-"
            val = f"{100 * m['validation_pass@k'][f'{t:g}'][j]:.1f}"
            rows.append([f"pass@{k}", f"{t:g}" + (" (edge)" if m["on_edge"][j] else ""), val, cell])
        parts.append(
            f"<h4>{_e(label)}: grid {_e(', '.join(f'{t:g}' for t in m['temperatures']))}, "
            f"{m['num_problems']} validation problems ({_e(m['validation'])})</h4>"
            + _table(["k", "chosen T", "validation %", "test % [95% CI]"], rows)
        )
    for c in sec["comparisons"]:
        if "diff" not in c:
            parts.append(f"<p>{_e(c['other'])} vs {_e(c['base'])}: {_e(c['note'])}</p>")
            continue
        rows = [[f"k={k}", _ci(c["diff"], k - 1), _e(c["verdict"][k - 1])] for k in default_ks(len(c["ks"]))]
        parts.append(
            f"<h4>{_e(c['other'])} &minus; {_e(c['base'])}, each at its {CHOSEN} ({c['num_problems']} problems)</h4>"
            + _table(["k", "difference, points [95% CI]", "verdict"], rows)
        )
    return "".join(parts)


def _seeds_html(entries: list) -> str:
    parts = []
    for c in entries:
        if "note" in c:
            parts.append(f"<p>{_e(c['other'])} &minus; {_e(c['base'])} over seeds: {_e(c['note'])}</p>")
            continue
        rows = []
        for k in default_ks(len(c["ks"])):
            j = k - 1
            per = [f"{_ci(v, j)} {_e(v['verdict'][j])}" for v in c["per_seed"].values()]
            rows.append([f"k={k}", _ci(c["pooled"], j), _e(c["verdict"][j]), f"{c['holds_in'][j]}", *per])
        head = ["k", "pooled, points [95% CI]", "verdict", "seeds with that verdict"]
        parts.append(
            f"<h4>{_e(c['other'])} &minus; {_e(c['base'])}, {_e(c['condition'])}: {len(c['seeds'])} seeds, "
            f"{c['num_problems']} problems</h4>" + _table(head + [f"seed {s}" for s in c["seeds"]], rows)
        )
    return "".join(parts)


def render_sections(report: dict) -> str:
    """The HTML of both sections (empty when the report has neither)."""
    body = []
    for src, sec in report.get("validation_chosen", {}).items():
        body.append(
            f"<h2>Validation-chosen temperature, {_e(src)}</h2><p>Each k's temperature is the one with the highest "
            "validation pass@k (ties: closest to 1.0, then the lower); the test set only reports it. "
            "&ldquo;edge&rdquo;: the grid's lowest or highest temperature, so the best may lie outside it.</p>"
            + _chosen_html(sec)
        )
    for src, entries in report.get("seeds", {}).items():
        body.append(
            f"<h2>Pooled over seeds, {_e(src)}</h2><p>Each seed's models are paired on the same problems; the "
            "interval resamples seeds and, once per replicate, problems (shared by every drawn seed). With 3 seeds "
            "the seed level is coarse: read the per-seed verdicts beside it.</p>" + _seeds_html(entries)
        )
    return "".join(body)
