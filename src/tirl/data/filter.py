"""`tirl data filter`: keep the problems whose pass rate under a model lies in a band, as RL rows for `tirl rl`.

GRPO learns nothing from a group whose rewards are all equal, so a problem the policy never or always solves spends
a step's rollouts on no signal. This command samples k answers per problem with the model exactly as `tirl data
sample` does (the same config, engine, sandbox and verifier, through `sampled_groups`), at the RL sampling settings
(`rollout.temperature`, `rollout.top_p`, `rollout.top_k`: the pass rate RL will see), counts the samples the
verifier grades correct, and keeps the problems whose rate correct / k lies in the band. The band is open by
default, (0, 1): solved sometimes, neither never nor always; `inclusive` closes both ends.

The rows written are the input rows unchanged but for `extra_info.filter` (`pass_rate`, `correct`, `k`), in the
input's order; the summary beside them counts the problems never, sometimes and always solved and holds every
problem's rate, so another band needs no new samples. Deliberately not here: dynamic re-sampling during RL
(`rl.dynamic_sampling`) or any re-weighting of the kept problems.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tirl.core.config import check_range
from tirl.data.sample import (
    add_sampling_arguments,
    check_outputs,
    load_problems,
    sampled_groups,
    summary_path,
)


@dataclass(frozen=True)
class Band:
    """Pass rates kept: `min_rate < rate < max_rate`, or with `inclusive` `min_rate <= rate <= max_rate`."""

    min_rate: float = 0.0
    max_rate: float = 1.0
    inclusive: bool = False

    def __post_init__(self) -> None:
        check_range("--min-rate", self.min_rate, 0.0, 1.0)
        check_range("--max-rate", self.max_rate, 0.0, 1.0)
        if self.max_rate < self.min_rate or (self.max_rate == self.min_rate and not self.inclusive):
            raise ValueError(f"the band {self} is empty: give --min-rate below --max-rate (or --inclusive)")

    def contains(self, rate: float) -> bool:
        if self.inclusive:
            return self.min_rate <= rate <= self.max_rate
        return self.min_rate < rate < self.max_rate

    def check_k(self, k: int) -> None:
        """Refuse a band that holds no rate j/k a problem can have with k samples."""
        if not any(self.contains(j / k) for j in range(k + 1)):
            raise ValueError(f"with --k {k} a pass rate is j/{k}, and none lies in {self}: widen the band")

    def __str__(self) -> str:
        lo, hi = ("[", "]") if self.inclusive else ("(", ")")
        return f"{lo}{self.min_rate:g}, {self.max_rate:g}{hi}"


@dataclass
class FilterStats:
    """What the samples said; written, with the settings, as the summary JSON next to the rows."""

    k: int
    band: str
    problems: int = 0
    kept: int = 0
    never: int = 0  # pass rate 0
    sometimes: int = 0  # 0 < pass rate < 1
    always: int = 0  # pass rate 1
    correct_counts: dict[int, int] = field(default_factory=dict)  # correct samples -> problems
    pass_rates: dict[str, float] = field(default_factory=dict)  # problem id -> rate, every problem

    def add(self, pid: str, correct: int, kept: bool) -> None:
        """One problem with `correct` of its k samples graded correct."""
        self.problems += 1
        self.kept += int(kept)
        self.never += int(correct == 0)
        self.always += int(correct == self.k)
        self.sometimes += int(0 < correct < self.k)
        self.correct_counts[correct] = self.correct_counts.get(correct, 0) + 1
        self.pass_rates[pid] = correct / self.k


def filtered_rows(
    agent: Any,
    rows: list[dict[str, Any]],
    band: Band,
    k: int,
    *,
    params: Any,
    reward: Any,
    seed: int,
    batch_problems: int = 32,
) -> tuple[list[dict[str, Any]], FilterStats]:
    """The rows whose pass rate over `k` samples lies in `band` (with `extra_info.filter`), in input order."""
    stats, out = FilterStats(k=k, band=str(band)), []
    groups = sampled_groups(
        agent, rows, k, params=params, reward=reward, seed=seed, batch_problems=batch_problems,
        what="filter", info=lambda: f"kept {stats.kept}",
    )  # fmt: skip
    for row, (problem, trajs) in zip(rows, groups, strict=True):
        correct = sum(1 for t in trajs if t.outcome is not None and t.outcome.correct)
        keep = band.contains(correct / k)
        stats.add(problem.problem_id, correct, keep)
        if keep:
            info = {**problem.extra, "filter": {"pass_rate": correct / k, "correct": correct, "k": k}}
            out.append({**row, "extra_info": info})
    return out, stats


def filter_command(args: argparse.Namespace) -> int:
    """`tirl data filter`: every argument checked, then sample, write the kept rows and the summary; 1 if none."""
    from tirl.commands.stages import eval_reward, inference_agent
    from tirl.core.io import atomic_write_json
    from tirl.data import write_rows
    from tirl.data.sample import engine_dir
    from tirl.train.rl_run import sampling_of

    out = check_outputs(args.out, force=args.force)
    if args.k < 1:
        raise ValueError(f"--k must be >= 1, got {args.k}")
    band = Band(args.min_rate, args.max_rate, args.inclusive)
    band.check_k(args.k)
    cfg, rows = load_problems(args)
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
    """`tirl data filter`, added to the `data` subcommands by data/commands.py."""
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
