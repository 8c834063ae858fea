"""`tirl analyze`: its parser and the command (claim the output directory, analyse, print the findings); what it
runs is `tirl.eval.report`."""

from __future__ import annotations

import argparse
from pathlib import Path

from tirl.core.rundir import claim
from tirl.eval.report import print_summary, run_analyze


def add_analyze_parser(sub: argparse._SubParsersAction) -> None:
    """`tirl analyze`, added to tirl's parser by cli.py."""
    p = sub.add_parser("analyze", help="pass@k analysis, report and trajectory viewer")
    p.add_argument(
        "runs",
        nargs="+",
        help="tirl eval directories, counts files (*.counts.jsonl) or verl validation dumps; the first is the "
        "baseline",
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
    p.add_argument(
        "--choose-temperature-on",
        default=None,
        metavar="VAL1,VAL2,...",
        help="comma-separated validation runs (evaluations of a validation slice at several temperatures), one per "
        "run in the same order: each model's temperature per k is chosen on its validation run and the test runs "
        "are reported at it",
    )
    p.add_argument(
        "--seeds",
        default=None,
        metavar="S1,S2,...",
        help="comma-separated seed labels, one per run: runs of one label and seed form one model, each seed's "
        "models are compared with the same seed's baseline, and the differences are pooled over seeds",
    )
    p.set_defaults(fn=analyze_command)


def analyze_command(args: argparse.Namespace) -> int:
    with claim(args.out, "analyze"):
        return main_analyze(args)


def main_analyze(args: argparse.Namespace) -> int:
    from tirl.eval.tables import AnalysisConfig

    labels = [x.strip() for x in args.labels.split(",")] if args.labels else None
    validation = _items(args.choose_temperature_on, "--choose-temperature-on")
    seeds = _items(args.seeds, "--seeds")
    report = run_analyze(
        args.runs,
        args.out,
        labels=labels,
        tokenizer=args.tokenizer,
        config=AnalysisConfig(num_resamples=args.bootstrap, seed=args.seed),
        viewer=not args.no_viewer,
        validation=validation,
        seeds=seeds,
    )
    print_summary(report, Path(args.out))
    return 0


def _items(value: str | None, flag: str) -> list[str] | None:
    """A comma-separated flag's items; an empty one is an error (a stray comma would shift every later run)."""
    if value is None:
        return None
    items = [x.strip() for x in value.split(",")]
    if not all(items):
        raise ValueError(f"{flag} {value!r} has an empty item")
    return items
