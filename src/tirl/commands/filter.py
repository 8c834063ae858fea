"""`tirl data filter`: its parser and the command (every argument checked, then sample, write the kept rows and
the summary); the filtering itself is `tirl.eval.pass_rate_filter`."""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

from tirl.commands.sample import add_sampling_arguments, check_in_flight, check_outputs, load_problems
from tirl.core.bounds import MAX_COUNT, check_range
from tirl.eval.pass_rate_filter import Band, FilterStats, filtered_rows
from tirl.eval.rejection_sampling import engine_dir, summary_path


def filter_command(args: argparse.Namespace) -> int:
    """`tirl data filter`: every argument checked, then sample, write the kept rows and the summary; 1 if none."""
    from tirl.commands.stages import eval_reward, inference_agent
    from tirl.core.io import atomic_write_json
    from tirl.data import write_rows
    from tirl.train.rl.check import sampling_of

    out = check_outputs(args.out, force=args.force)
    if args.k < 1:
        raise ValueError(f"--k must be >= 1, got {args.k}")
    check_range("--k", args.k, 1, MAX_COUNT)  # each problem's k samples are held at once
    band = Band(args.min_rate, args.max_rate, args.inclusive)
    band.check_k(args.k)
    cfg, rows = load_problems(args)
    check_in_flight("--k", args.k, cfg.eval.batch_problems)
    params = sampling_of(cfg.rollout)
    start = time.perf_counter()
    with inference_agent(cfg, None, engine_dir(out)) as agent:
        kept, stats = filtered_rows(
            agent, rows, band, args.k, params=params, reward=eval_reward(cfg), seed=cfg.seed,
            batch_problems=cfg.eval.batch_problems,
        )  # fmt: skip
    write_rows(out, kept)
    summary = {
        **dataclasses.asdict(stats),
        "wall_s": round(time.perf_counter() - start, 1),
        "settings": {
            "k": args.k, "min_rate": band.min_rate, "max_rate": band.max_rate, "inclusive": band.inclusive,
            "model": cfg.model.path, "data": args.data or f"task {cfg.task.name}", "seed": cfg.seed,
            "temperature": params.temperature, "top_p": params.top_p, "top_k": params.top_k, "format": cfg.chat.format,
        },
    }  # fmt: skip
    atomic_write_json(summary_path(out), summary)
    _print(stats, out, summary["wall_s"])
    return 0 if kept else 1


def _print(stats: FilterStats, out: Path, wall_s: float) -> None:
    from tirl.core.logging import console

    counts = ", ".join(f"{c}: {n}" for c, n in sorted(stats.correct_counts.items()))
    console.print(
        f"{stats.problems} problems x {stats.k} samples: never solved {stats.never}, sometimes {stats.sometimes}, "
        f"always {stats.always} (problems per correct count: {counts}); {stats.kept} with a pass rate in "
        f"{stats.band} -> {out} ({wall_s} s)",
        soft_wrap=True,
    )
    if not stats.kept:
        console.print(f"[bold red]no problem has a pass rate in {stats.band}[/]: {out} holds no rows")


def add_filter_parser(data: argparse._SubParsersAction) -> None:
    """`tirl data filter`, added to the `data` subcommands by commands/data.py."""
    p = data.add_parser(
        "filter",
        help="sample k answers per problem; keep the problems whose pass rate lies in a band, as RL rows",
    )
    add_sampling_arguments(p, "RL rows to write")
    p.add_argument("--k", type=int, default=8, help="samples per problem (default 8)")
    p.add_argument("--min-rate", type=float, default=0.0, help="the band's low end (default 0, excluded)")
    p.add_argument("--max-rate", type=float, default=1.0, help="the band's high end (default 1, excluded)")
    p.add_argument(
        "--inclusive",
        action="store_true",
        help="keep rates equal to --min-rate or --max-rate too (default: both ends excluded)",
    )
    p.set_defaults(fn=filter_command)
