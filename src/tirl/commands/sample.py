"""`tirl data sample`: its parser and the command (load the config and the problems, sample, write the rows and
the summary); the sampling itself is `tirl.eval.rejection_sampling`. The arguments and checks every sampling
command shares (`tirl data filter` too) are here."""

from __future__ import annotations

import argparse
import dataclasses
import os
import time
from pathlib import Path
from typing import Any

from tirl.eval.rejection_sampling import SampleConfig, SampleStats, engine_dir, sample_rows, summary_path


def check_outputs(out: str | Path, *, force: bool) -> Path:
    """Refuse, before any work, rows `out`, its summary or its engine directory that cannot be written or would
    replace a file without `force`; clear what a killed earlier write of them staged. Returns `out`."""
    from tirl.core.io import OutputPathError, remove_stale_staging
    from tirl.data import claim_rows_out

    out = claim_rows_out(out, force=force)
    summary, work = summary_path(out), engine_dir(out)
    if summary.is_symlink():  # the rename would replace the link, not the file it leads to
        raise OutputPathError(
            f"{summary} (the summary of --out {out}) is a symbolic link to {os.readlink(summary)}: remove the link "
            "or choose another --out"
        )
    if summary.is_dir() or ((summary.exists() or summary.is_symlink()) and not force):
        what = "is a directory:" if summary.is_dir() else "already exists: pass --force to replace it, or"
        raise OutputPathError(f"{summary} (the summary of --out {out}) {what} choose another --out")
    if work.exists() and not work.is_dir():
        raise OutputPathError(f"{work} (the engine directory of --out {out}) is a file: choose another --out")
    remove_stale_staging(summary.parent, summary.name)
    return out


def load_problems(args: argparse.Namespace) -> tuple[Any, list[dict[str, Any]]]:
    """The run config (`--config` and overrides; torch set up) and the problems of a sampling command: the rows of
    `--data`, else the task's train rows, at most `eval.max_problems`."""
    from tirl.commands.run_config import TirlConfig
    from tirl.commands.stages import setup_torch, task_rows
    from tirl.core.config import load_config
    from tirl.data import read_rows

    cfg = load_config(TirlConfig, args.config, args.overrides)
    setup_torch(cfg)
    rows = read_rows(args.data) if args.data else task_rows(cfg, "", "train")
    return cfg, rows[: cfg.eval.max_problems or None]


def check_in_flight(option: str, n: int, batch_problems: int) -> None:
    """Refuse `n` samples (of `option`) of `eval.batch_problems` problems each batch past what a run holds at once."""
    from tirl.core.bounds import MAX_IN_FLIGHT, check_product

    check_product(
        (option, "eval.batch_problems"), (n, batch_problems), MAX_IN_FLIGHT, "trajectories held at once",
        "lower eval.batch_problems",
    )  # fmt: skip


def sample_command(args: argparse.Namespace) -> int:
    """`tirl data sample`: load the config, sample, write the rows and the summary (token-check drops in red)."""
    from tirl.commands.stages import eval_reward, inference_agent
    from tirl.core.io import atomic_write_json
    from tirl.data import write_rows
    from tirl.rollout.sampling import SamplingParams

    out = check_outputs(args.out, force=args.force)
    scfg = SampleConfig(
        n=args.n, keep=args.keep, require_tool=args.require_tool, keep_retokenized=args.keep_retokenized
    )
    cfg, rows = load_problems(args)
    check_in_flight("--n", scfg.n, cfg.eval.batch_problems)
    params = SamplingParams(temperature=cfg.eval.temperature, top_p=cfg.eval.top_p)
    start = time.perf_counter()
    with inference_agent(cfg, None, engine_dir(out)) as agent:
        kept, stats = sample_rows(
            agent, rows, scfg, params=params, reward=eval_reward(cfg), seed=cfg.seed,
            batch_problems=cfg.eval.batch_problems,
        )  # fmt: skip
    write_rows(out, kept)
    summary = {
        **stats.summary(),
        "wall_s": round(time.perf_counter() - start, 1),
        "settings": {
            **dataclasses.asdict(scfg), "model": cfg.model.path, "data": args.data or f"task {cfg.task.name}",
            "temperature": params.temperature, "top_p": params.top_p, "seed": cfg.seed, "format": cfg.chat.format,
        },
    }  # fmt: skip
    atomic_write_json(summary_path(out), summary)
    _print_summary(stats, summary, out)
    return 0


def _print_summary(stats: SampleStats, summary: dict[str, Any], out: Path) -> None:
    from tirl.core.logging import console

    console.print(
        f"{stats.problems} problems, {stats.samples} samples, {stats.correct} correct, {stats.kept} kept "
        f"({summary['problems_with_kept']} problems with a kept sample); dropped: {stats.no_tool} without a tool "
        f"call, {stats.duplicates} duplicates, {stats.over_keep} past --keep -> {out} ({summary['wall_s']} s)",
        soft_wrap=True,
    )
    if stats.retokenized:
        console.print(
            f"{stats.retokenized} of the kept rows are kept as text (--keep-retokenized): the same text as "
            "sampled, split into the tokenizer's own tokens",
            soft_wrap=True,
        )
    if stats.token_check_failed:
        console.print(
            f"[bold red]token check: {stats.token_check_failed} rows dropped[/] (their SFT rendering differs from "
            f"the sampled ids or mask; first ones below, all counted in {summary_path(out)})",
            soft_wrap=True,
        )
        for f in stats.failures:
            console.print(f, markup=False, highlight=False, soft_wrap=True)


def add_sampling_arguments(p: argparse.ArgumentParser, out_help: str) -> None:
    """The arguments every sampling command takes: the config and its overrides, the problems, the output."""
    p.add_argument(
        "--config", default=None, help="run config (model.path, rollout.*, chat.*, sandbox.*, eval.*)"
    )
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. model.path=DIR eval.temperature=0.8")
    p.add_argument(
        "--data", default=None, help="problems (RL-schema .jsonl/.parquet; default: the task's train rows)"
    )
    p.add_argument(
        "--out", required=True, help=f"{out_help} (.jsonl or .parquet); an existing one needs --force"
    )
    p.add_argument("--force", action="store_true", help="replace --out and its summary if they exist")


def add_sample_parser(data: argparse._SubParsersAction) -> None:
    """`tirl data sample`, added to the `data` subcommands by commands/data.py."""
    p = data.add_parser(
        "sample",
        help="sample n tool trajectories per problem with the real sandbox; keep verified-correct ones as SFT rows",
    )
    add_sampling_arguments(p, "SFT rows to write")
    p.add_argument("--n", type=int, default=8, help="samples per problem (default 8)")
    p.add_argument(
        "--keep", type=int, default=1, help="correct distinct samples kept per problem at most (default 1)"
    )
    p.add_argument(
        "--require-tool",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="keep only samples with at least one executed tool call (default on)",
    )
    p.add_argument(
        "--keep-retokenized",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="keep a correct sample whose ids are not the tokenizer's own split of its text, as that text (SFT "
        "re-tokenizes it); default off: every row is exactly the ids sampled",
    )
    p.set_defaults(fn=sample_command)
