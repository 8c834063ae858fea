"""What `tirl analyze RUN_A RUN_B ... --labels base,rl --out DIR` runs (its front end is `tirl.commands.analyze`):
load, analyse, write report.json, plots, pages.

Outputs in DIR: report.json (every number), *.png, report.html (self-contained) and trajectories.html with its
data directory. They are written into a staging directory inside DIR and moved into place together once all are
written (`tirl.core.io.staged_contents`): a failure (a full disk, a plot that cannot be drawn) leaves DIR as it
was, never half of a new analysis beside half of an old one.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from tirl.core.io import atomic_write_json, atomic_write_text, staged_contents

if (
    TYPE_CHECKING
):  # the analysis imports math-verify (sympy): only when a command runs, not to build the parser
    from tirl.eval.tables import AnalysisConfig


def run_analyze(
    paths: Sequence[str | Path],
    out_dir: str | Path,
    *,
    labels: Sequence[str] | None = None,
    tokenizer: str | None = None,
    config: AnalysisConfig | None = None,
    viewer: bool = True,
    validation: Sequence[str | Path] | None = None,
    seeds: Sequence[str] | None = None,
) -> dict:
    """Analyse the runs (the first is the baseline); returns the report dict (with "seconds" per phase).
    `validation`: one validation run per run, to choose temperatures on; `seeds`: one seed per run, to pool over
    (`tirl.eval.selection_report`)."""
    from tirl.eval.analysis import analyze_runs
    from tirl.eval.samples import load_run
    from tirl.eval.selection_report import add_sections, plan_runs
    from tirl.eval.tables import AnalysisConfig

    if not paths:
        raise ValueError("analyze needs at least one run")
    if labels is not None and len(labels) != len(paths):
        raise ValueError(f"--labels gives {len(labels)} names for {len(paths)} runs")
    if validation is not None and len(validation) != len(paths):
        raise ValueError(
            f"--choose-temperature-on gives {len(validation)} validation runs for {len(paths)} runs"
        )
    cfg = config or AnalysisConfig()
    out = Path(out_dir)
    times = {}
    t0 = time.time()
    runs = [load_run(p, labels[i] if labels else None) for i, p in enumerate(paths)]
    val = [load_run(p, runs[i].label) for i, p in enumerate(validation)] if validation is not None else None
    plan = plan_runs(runs, val, None if seeds is None else list(seeds))
    runs = plan.runs
    for r in runs:
        if r.tokenizer_path is None and tokenizer:
            r.tokenizer_path = tokenizer
    times["load"] = time.time() - t0
    t0 = time.time()
    report = analyze_runs(runs, cfg, plan.pairs)
    add_sections(report, plan, cfg)
    times["analysis"] = time.time() - t0
    with staged_contents(out) as stage:
        _write_outputs(report, runs, stage, times, viewer=viewer)
    return report


def _write_outputs(report: dict, runs: list, out: Path, times: dict[str, float], *, viewer: bool) -> None:
    """report.json, the plots, the trajectory viewer and report.html, into `out`; the seconds each took go to
    `times` and the report."""
    from tirl.eval.plots import plot_report
    from tirl.eval.report_html import render_report
    from tirl.eval.viewer import write_viewer

    t0 = time.time()
    figures = plot_report(report, out)
    times["plots"] = time.time() - t0
    t0 = time.time()
    page = write_viewer(runs, out) if viewer else None
    times["viewer"] = time.time() - t0
    atomic_write_text(out / "report.html", render_report(report, figures, viewer=page.name if page else None))
    report["seconds"] = times
    atomic_write_json(out / "report.json", report)


def print_summary(report: dict, out: Path) -> None:
    """The findings and where the report is, on the console."""
    from tirl.core.logging import console

    for line in report["findings"]:
        console.print(line, markup=False)
    for src, entry in report["sources"].items():
        for c in entry["comparisons"]:
            if c.get("num_problems"):
                s = c["solvable"]
                console.print(
                    f"[{src}] solvable within n ({c['condition']}): only {c['base']} {s['base_only_count']}, "
                    f"only {c['other']} {s['other_only_count']}, both {s['both_count']}, neither {s['neither_count']}",
                    markup=False,
                )
    for src, entry in report["sources"].items():
        for label, m in entry["models"].items():
            for tkey, b in sorted(m["temperatures"].items()):
                n, v = b["n"], b["verl_bootstrap"]
                if n in v["ks"]:
                    j = v["ks"].index(n)
                    console.print(
                        f"[{src}] {label} T={tkey}: pass@{n} {b['pass@k']['mean'][n - 1]:.3f} (unbiased) vs "
                        f"bootstrap_best@{n} {v['best@k'][j]:.3f} (verl); maj@{n} {b['maj@k']['mean'][-1]:.3f} vs "
                        f"bootstrap_maj@{n} {v['maj@k'][j]:.3f}",
                        markup=False,
                    )
    for label, a in report["audit"].items():
        console.print(
            f"audit {label}: {100 * a['false_share']:.1f}% of {a['correct_answers']} correct answers have a false "
            f"arithmetic statement; final number from the tool in {100 * a['answer_source']['tool']:.1f}%",
            markup=False,
        )
    for label, m in report.get("reasoning_mode", {}).items():
        console.print(f"reasoning mode {label}: {m['verdict']}", markup=False, soft_wrap=True)
    console.print(
        f"report: {out / 'report.html'}  (numbers: {out / 'report.json'}; trajectories: {out / 'trajectories.html'})"
    )
