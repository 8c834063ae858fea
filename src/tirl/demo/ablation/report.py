"""A comparison end to end, and what it leaves: the arms run (`runner`), their numbers gathered (`results`,
`summary`), the figures drawn, `report.json` written in the root, and a table and one line per comparison on the
console.

report.json: `study` (the arms with their overrides, baseline, seeds, start), `runs` (every arm and seed: done or
failed with its error, its directories, seconds), `failed` (arm -> seed -> error), `arms` (per arm: metrics' mean [min, max] over seeds, pass@k,
training curves), `comparisons` (per arm against the baseline: paired differences with 95% intervals, the
line), `figures`, `seconds`, `machine`.
"""

from __future__ import annotations

import dataclasses
import time
from collections import defaultdict
from dataclasses import asdict
from typing import Any

from rich.table import Table

from tirl.commands.run_config import TirlConfig
from tirl.commands.stages import setup_torch
from tirl.core.config import save_config
from tirl.core.io import atomic_write_json
from tirl.core.logging import console
from tirl.demo.ablation.arms import Study
from tirl.demo.ablation.figures import plot_all
from tirl.demo.ablation.results import SeedResult, load_result
from tirl.demo.ablation.runner import ArmRun, Layout, run_arms
from tirl.demo.ablation.summary import summarize
from tirl.models.precision import cpu_description


def study_record(study: Study, base: TirlConfig) -> dict[str, Any]:
    return {
        "name": study.name,
        "summary": study.summary,
        "arms": [
            {"name": a.name, "overrides": list(a.overrides), "note": a.note, "sft_data": a.sft_data}
            for a in study.arms
        ],
        "baseline": study.baseline_arm,
        "seeds": list(range(base.seed, base.seed + study.seeds)),
        "start": study.start,
        "expect": dict(study.expect),
        "train": study.train,
        "stages": study.stages,
    }


def build_report(study: Study, base: TirlConfig, runs: list[ArmRun], layout: Layout) -> dict[str, Any]:
    """The report of finished runs (reads their files; draws the figures into the root)."""
    results: dict[str, list[SeedResult]] = {a.name: [] for a in study.arms}
    for i, r in enumerate(runs):
        if r.status != "done":
            continue
        try:
            results[r.arm].append(load_result(r))
        except (OSError, ValueError, KeyError) as e:  # a file removed or cut short since: that seed is lost
            runs[i] = dataclasses.replace(r, status="failed", error=f"its results cannot be read: {e}")
    summary = summarize(results, study.baseline_arm, study.expect)
    failed: dict[str, dict[str, str]] = defaultdict(dict)
    for r in runs:
        if r.status == "failed":
            failed[r.arm][str(r.seed)] = r.error
    return {
        "study": study_record(study, base),
        "runs": [asdict(r) for r in runs],
        "failed": dict(failed),
        **summary,
        "figures": plot_all(summary, layout.root),
        "machine": cpu_description(),  # float-level results move between CPUs: the numbers name theirs
    }


def run_comparison(base: TirlConfig, study: Study, layout: Layout) -> dict[str, Any]:
    """Run (or resume) the comparison and write its report; returns the report."""
    setup_torch(base)
    t0 = time.time()
    save_config(base, layout.root / "config.yaml")
    atomic_write_json(layout.root / "study.json", study_record(study, base))
    runs = run_arms(base, study, layout)
    report = build_report(study, base, runs, layout)
    report["seconds"] = round(time.time() - t0, 1)
    atomic_write_json(layout.root / "report.json", report)
    print_report(report)
    console.print(f"report: {layout.root / 'report.json'}", soft_wrap=True)
    return report


def _cell(m: dict[str, float] | None, name: str) -> str:
    if m is None:
        return "-"
    pct = name.startswith(("pass@", "maj@")) or name.split(" ")[0].endswith(("share", "rate"))
    scale, digits = (100, 1) if pct else (1, 2)
    return f"{scale * m['mean']:.{digits}f} [{scale * m['min']:.{digits}f}, {scale * m['max']:.{digits}f}]"


def print_report(report: dict[str, Any]) -> None:
    """The per-arm table (mean [min, max] over seeds, shares in %), failures, and one line per comparison."""
    arms = report["arms"]
    if arms:
        table = Table(title=f"{report['study']['name']}: mean [min, max] over seeds")
        table.add_column("metric")
        for name, a in arms.items():
            table.add_column(f"{name} ({len(a['seeds'])} seeds)", justify="right")
        names = list(dict.fromkeys(n for a in arms.values() for n in a["metrics"]))
        for n in names:
            table.add_row(n, *(_cell(a["metrics"].get(n), n) for a in arms.values()))
        console.print(table)
    for r in report["runs"]:
        if r["status"] == "failed":
            console.print(f"[bold red]failed[/] {r['arm']} seed {r['seed']}: {r['error']}", soft_wrap=True)
    for c in report["comparisons"]:
        console.print(c["line"], markup=False, soft_wrap=True)
