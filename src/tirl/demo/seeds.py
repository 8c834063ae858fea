"""`tirl demo --seeds N`: the demo once per seed, and what holds across the seeds.

One seed's numbers move with float-level differences: the same code and seed give SFT 44.9% pass@1 on an AVX-512
CPU and 21.7% on an AVX2 one, while the RL lift repeats. A headline should say what repeats, so each seed runs the
whole demo into OUT/seed-<s>/ (seeds `seed`, `seed`+1, ...; one after the other, since each run already uses every
core of a small machine; a seed whose directory holds a finished run with the same config is reused), then:
- every metric of the report: its mean, min and max over the seeds, for SFT, RL and RL - SFT;
- the pass@1 lift (RL - SFT): a 95% interval from a two-level bootstrap, seeds and then problems within each
  seed, paired (a seed's SFT and RL answered the same problems);
- the crossover: per seed, the smallest k at which SFT's pass@k reaches RL's, and whether every seed has one.
All of it goes to OUT/seeds.json and a table.
"""

from __future__ import annotations

import dataclasses
import json
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from rich.table import Table

from tirl.commands.run_config import TirlConfig
from tirl.core.config import read_config_file, to_dict
from tirl.core.io import atomic_write_json
from tirl.core.logging import console
from tirl.core.yamlread import load_yaml
from tirl.models.precision import cpu_description

RESAMPLES = 2000


def seed_config(cfg: TirlConfig, seed: int) -> TirlConfig:
    """`cfg` for one seed of the sweep: its seed, and its own directory under `cfg.out_dir`."""
    return dataclasses.replace(cfg, seed=seed, out_dir=str(Path(cfg.out_dir) / f"seed-{seed}"))


def finished(cfg: TirlConfig) -> bool:
    """A seed directory holds a finished demo (its report with the analysis) of exactly this config."""
    out = Path(cfg.out_dir)
    try:
        report = json.loads((out / "report.json").read_text())
        saved = read_config_file(out / "config.yaml")
    except (OSError, ValueError):  # a ConfigError too: a file that is not a config is no finished demo
        return False
    return "analysis" in report and saved == load_yaml(yaml.safe_dump(to_dict(cfg)))


def per_problem_pass1(eval_dir: Path) -> dict[str, float]:
    """problem id -> share of its samples answered correctly, from an evaluation's records.jsonl."""
    hits: dict[str, list[bool]] = defaultdict(list)
    with open(eval_dir / "records.jsonl") as f:
        for line in f:
            r = json.loads(line)
            hits[r["problem_id"]].append(bool(r["correct"]))
    return {p: sum(v) / len(v) for p, v in hits.items()}


def lift_interval(
    diffs: list[np.ndarray], *, seed: int = 0, level: float = 0.95
) -> tuple[float, float, float]:
    """(mean, lo, hi) of the mean per-problem lift: resample seeds, then problems within each drawn seed.

    diffs: one (P_s,) array per seed, RL - SFT pass@1 of each problem."""
    rng = np.random.default_rng(seed)
    reps = np.empty((len(diffs), RESAMPLES))  # per seed: its problem-bootstrap replicates of the mean lift
    for s, d in enumerate(diffs):
        w = rng.multinomial(len(d), np.full(len(d), 1.0 / len(d)), size=RESAMPLES)
        reps[s] = w @ d / len(d)
    drawn = rng.integers(0, len(diffs), size=(RESAMPLES, len(diffs)))  # seeds drawn with replacement
    totals = reps[drawn, np.arange(RESAMPLES)[:, None]].mean(axis=1)
    a = (1 - level) / 2
    mean = float(np.mean([d.mean() for d in diffs]))
    return mean, float(np.quantile(totals, a)), float(np.quantile(totals, 1 - a))


def crossover_k(report: dict[str, Any]) -> int | None:
    """The smallest k at which SFT's pass@k is at least RL's (None: RL leads at every k)."""
    sft, rl = report["sft"]["pass@k"], report["rl"]["pass@k"]
    return next((int(k) for k in sorted(sft, key=int) if sft[k] >= rl[k]), None)


def _metrics(entry: dict[str, Any]) -> dict[str, float]:
    out = {f"pass@{k}": v for k, v in entry["pass@k"].items()}
    out.update({f"maj@{k}": v for k, v in entry["maj@k"].items() if k != "1"})
    for key in ("tool_calls_per_response", "no_tool_share", "tool_error_rate"):
        out[key] = entry[key]
    return out


def _spread(values: list[float]) -> dict[str, float]:
    return {"mean": float(np.mean(values)), "min": float(min(values)), "max": float(max(values))}


def summarize(runs: dict[int, Path]) -> dict[str, Any]:
    """The cross-seed summary of finished demo directories {seed: OUT/seed-<s>} (module docstring)."""
    reports = {s: json.loads((d / "report.json").read_text()) for s, d in runs.items()}
    metrics: dict[str, dict[str, Any]] = {}
    for name in _metrics(next(iter(reports.values()))["sft"]):
        sft = [_metrics(r["sft"])[name] for r in reports.values()]
        rl = [_metrics(r["rl"])[name] for r in reports.values()]
        metrics[name] = {
            "sft": _spread(sft),
            "rl": _spread(rl),
            "rl-sft": _spread(list(np.subtract(rl, sft))),
        }
    diffs = []
    for d in runs.values():
        sft, rl = per_problem_pass1(d / "eval-sft"), per_problem_pass1(d / "eval-rl")
        diffs.append(np.array([rl[p] - sft[p] for p in sorted(sft)]))
    mean, lo, hi = lift_interval(diffs)
    crossovers = {str(s): crossover_k(r) for s, r in reports.items()}
    first = next(iter(reports.values()))
    return {
        "seeds": sorted(runs),
        "problems": first["sft"]["num_problems"],
        "samples_per_problem": first["sft"]["samples_per_problem"],
        "metrics": metrics,
        "lift_pass@1": {"mean": mean, "lo": lo, "hi": hi, "level": 0.95, "resamples": RESAMPLES},
        "crossover_k": crossovers,
        "crossover_repeats": all(k is not None for k in crossovers.values()),
        "seconds": {  # wall seconds (a stage's "NAME cpu" entry is its CPU time)
            str(s): sum(v for k, v in r["seconds"].items() if not k.endswith(" cpu"))
            for s, r in reports.items()
        },
        "machine": cpu_description(),  # float-level results move between CPUs: the numbers name theirs
    }


def run_seeds(cfg: TirlConfig, seeds: int, run: Callable[[TirlConfig], Any]) -> dict[str, Any]:
    """`run` (the demo) for seeds cfg.seed .. cfg.seed + seeds - 1, then the summary in OUT/seeds.json."""
    if seeds < 1:
        raise ValueError(f"--seeds must be >= 1, got {seeds}")
    runs: dict[int, Path] = {}
    for i in range(seeds):
        sub = seed_config(cfg, cfg.seed + i)
        if finished(sub):
            console.print(f"[bold]seed {sub.seed}[/]: a finished run of this config in {sub.out_dir}, reused")
        else:
            console.rule(f"seed {sub.seed} ({i + 1} of {seeds})")
            run(sub)
        runs[sub.seed] = Path(sub.out_dir)
    summary = summarize(runs)
    atomic_write_json(Path(cfg.out_dir) / "seeds.json", summary)
    print_seeds(summary)
    console.print(f"summary: {Path(cfg.out_dir) / 'seeds.json'}")
    return summary


def _cell(x: dict[str, float], pct: bool, signed: bool = False) -> str:
    """mean [min, max], in points for shares."""
    scale, digits = (100, 1) if pct else (1, 2)
    mean = f"{scale * x['mean']:{'+' if signed else ''}.{digits}f}"
    return f"{mean} [{scale * x['min']:.{digits}f}, {scale * x['max']:.{digits}f}]"


def print_seeds(summary: dict[str, Any]) -> None:
    table = Table(
        title=f"{len(summary['seeds'])} seeds x {summary['problems']} problems x {summary['samples_per_problem']} "
        "samples: mean [min, max]"
    )
    for col in ("metric", "SFT", "RL", "RL - SFT"):
        table.add_column(col, justify="left" if col == "metric" else "right")
    for name, m in summary["metrics"].items():
        pct = name.startswith(("pass@", "maj@")) or name.endswith(("share", "rate"))
        table.add_row(name, _cell(m["sft"], pct), _cell(m["rl"], pct), _cell(m["rl-sft"], pct, signed=True))
    console.print(table)
    lift = summary["lift_pass@1"]
    console.print(
        f"pass@1 lift {100 * lift['mean']:+.1f} points, 95% interval [{100 * lift['lo']:+.1f}, "
        f"{100 * lift['hi']:+.1f}] (bootstrap over seeds and problems)"
    )
    ks = ", ".join(
        f"seed {s}: {'none' if k is None else f'k={k}'}" for s, k in summary["crossover_k"].items()
    )
    verdict = "repeats" if summary["crossover_repeats"] else "does not repeat"
    console.print(f"crossover (SFT reaches RL's pass@k) {verdict}: {ks}")
