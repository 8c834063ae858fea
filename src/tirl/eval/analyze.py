"""`tirl analyze RUN_A RUN_B ... --labels base,rl --out DIR`: load, analyse, write report.json, plots, pages.

Outputs in DIR: report.json (every number), *.png, report.html (self-contained) and trajectories.html with its
data directory. Each file is written atomically; the JSON first, so the numbers survive a failure in plotting.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from tirl.eval.analysis import AnalysisConfig, analyze_runs
from tirl.eval.samples import load_run
from tirl.io import atomic_write_json, atomic_write_text


def run_analyze(
    paths: Sequence[str | Path],
    out_dir: str | Path,
    *,
    labels: Sequence[str] | None = None,
    tokenizer: str | None = None,
    config: AnalysisConfig | None = None,
    viewer: bool = True,
) -> dict:
    """Analyse the runs (the first is the baseline); returns the report dict (with "seconds" per phase)."""
    if not paths:
        raise ValueError("analyze needs at least one run")
    if labels is not None and len(labels) != len(paths):
        raise ValueError(f"--labels gives {len(labels)} names for {len(paths)} runs")
    cfg = config or AnalysisConfig()
    out = Path(out_dir)
    times = {}
    t0 = time.time()
    runs = [load_run(p, labels[i] if labels else None) for i, p in enumerate(paths)]
    for r in runs:
        if r.tokenizer_path is None and tokenizer:
            r.tokenizer_path = tokenizer
    times["load"] = time.time() - t0
    t0 = time.time()
    report = analyze_runs(runs, cfg)
    times["analysis"] = time.time() - t0
    atomic_write_json(out / "report.json", report)

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
    return report
