"""`tirl analyze`: its parser and the command (claim the output directory, analyse, print the findings); what it
runs is `tirl.eval.analyze`."""

from __future__ import annotations

import argparse
from pathlib import Path

from tirl.core.rundir import claim
from tirl.eval.analyze import print_summary, run_analyze


def add_analyze_parser(sub: argparse._SubParsersAction) -> None:
    """`tirl analyze`, added to tirl's parser by cli.py."""
    p = sub.add_parser("analyze", help="pass@k analysis, report and trajectory viewer")
    p.add_argument(
        "runs", nargs="+", help="tirl eval directories or verl validation dumps; the first is the baseline"
    )
    p.add_argument(
        "--labels", default=None, help="comma-separated model names, one per run (default: from the records)"
    )
    p.add_argument("--out", default="runs/analysis", help="output directory (default: runs/analysis)")
    p.add_argument(
        "--tokenizer",
        default=None,
        help="model directory whose tokenizer decodes mask spans when a run names none",
    )
    p.add_argument(
        "--bootstrap", type=int, default=1000, help="bootstrap replicates over problems (default 1000)"
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the bootstrap and Monte Carlo maj@k")
    p.add_argument("--no-viewer", action="store_true", help="skip trajectories.html")
    p.set_defaults(fn=analyze_command)


def analyze_command(args: argparse.Namespace) -> int:
    with claim(args.out, "analyze"):
        return main_analyze(args)


def main_analyze(args: argparse.Namespace) -> int:
    from tirl.eval.analysis import AnalysisConfig

    labels = [x.strip() for x in args.labels.split(",")] if args.labels else None
    report = run_analyze(
        args.runs,
        args.out,
        labels=labels,
        tokenizer=args.tokenizer,
        config=AnalysisConfig(num_resamples=args.bootstrap, seed=args.seed),
        viewer=not args.no_viewer,
    )
    print_summary(report, Path(args.out))
    return 0
