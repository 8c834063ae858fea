"""What the summary reads of one finished arm and seed, gathered from its files into a `SeedResult`: the evaluation's
summary metrics, per-problem values at the first evaluation temperature (what the paired intervals pair), and the
RL run's training series from its `metrics.jsonl`.

Not here: anything across seeds or arms (`summary`, which takes `SeedResult`s, so it is tested on hand-made ones).
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tirl.demo.ablation.runner import ArmRun
from tirl.eval.metrics import default_ks, pass_at_k

# RL metrics drawn per arm, mean and band over seeds (`tirl.train.rl.batch`, `tirl.train.rl.update`): those a run logged
TRAINING_SERIES = (
    "reward/mean",
    "reward/accuracy",
    "rollout/entropy",
    "loss/entropy",
    "loss/clipfrac",
    "loss/clipfrac_low",
    "loss/clipfrac_high",
    "loss/kl",
    "rollout/response_tokens",
    "rollout/tool_calls_per_response",
    "adv/signal_share",
)
SUMMARY_METRICS = ("tool_calls_per_response", "no_tool_share", "tool_error_rate", "response_tokens")


@dataclass(frozen=True)
class SeedResult:
    """One arm's numbers for one seed. per_problem: metric -> problem ("source/id") -> value, at `temperature`;
    training: series -> step -> value."""

    arm: str
    seed: int
    metrics: dict[str, float]
    per_problem: dict[str, dict[str, float]]
    training: dict[str, dict[int, float]] = field(default_factory=dict)
    temperature: float | None = None


def summary_metrics(summary: dict[str, dict[str, float]]) -> dict[str, float]:
    """Flat metrics of an evaluation summary: pass@k, maj@k and tool use; suffixed with the condition (" T=0.6")
    when the evaluation has several (temperatures), pooled over data sources where it has several."""
    pooled = {k: v for k, v in summary.items() if k == "all" or k.startswith("all ")}
    entries = pooled or summary
    out: dict[str, float] = {}
    for key, s in entries.items():
        suffix = "" if len(entries) == 1 else " " + (key.split(" ", 1)[1] if " T=" in key else key)
        for name, value in s.items():
            keep = name.startswith("pass@") or (name.startswith("maj@") and name != "maj@1")
            if keep or name in SUMMARY_METRICS:
                out[f"{name}{suffix}"] = float(value)
    return out


def per_problem(records: list[dict[str, Any]]) -> tuple[dict[str, dict[str, float]], float | None]:
    """pass@k for k = 1, 2, 4, ..., n, tool calls and response tokens per problem, at the first temperature of
    the records (samples of different temperatures are never pooled)."""
    if not records:
        return {}, None
    temperature = records[0].get("temperature")
    by_problem: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        if r.get("temperature") == temperature:
            by_problem[f"{r['data_source']}/{r['problem_id']}"].append(r)
    n = min(len(v) for v in by_problem.values())
    out: dict[str, dict[str, float]] = defaultdict(dict)
    for pid, rs in sorted(by_problem.items()):
        c = sum(bool(r["correct"]) for r in rs)
        for k in default_ks(n):
            out[f"pass@{k}"][pid] = pass_at_k(len(rs), c, k)
        out["tool_calls_per_response"][pid] = sum(r["num_tool_calls"] for r in rs) / len(rs)
        tokens = [r["response_tokens"] for r in rs if r.get("response_tokens") is not None]
        if tokens:
            out["response_tokens"][pid] = sum(tokens) / len(tokens)
    return dict(out), temperature


def training_series(metrics_file: Path) -> dict[str, dict[int, float]]:
    """TRAINING_SERIES of an RL run's metric rows (the training rows: those with reward/mean), by step."""
    out: dict[str, dict[int, float]] = defaultdict(dict)
    if not metrics_file.is_file():
        return {}
    for line in metrics_file.read_text(encoding="utf-8").splitlines():
        row = json.loads(line) if line.strip() else {}
        if "reward/mean" not in row:
            continue
        for name in TRAINING_SERIES:
            if isinstance(row.get(name), int | float):
                out[name][int(row["step"])] = float(row[name])
    return dict(out)


def load_result(run: ArmRun) -> SeedResult:
    """A finished ArmRun's numbers, from its evaluation directory and RL run directory."""
    eval_dir = Path(run.eval_dir)
    summary = json.loads((eval_dir / "summary.json").read_text(encoding="utf-8"))
    with open(eval_dir / "records.jsonl", encoding="utf-8") as f:
        records = [json.loads(line) for line in f if line.strip()]
    problems, temperature = per_problem(records)
    training = training_series(Path(run.rl_dir) / "metrics.jsonl") if run.rl_dir else {}
    return SeedResult(run.arm, run.seed, summary_metrics(summary), problems, training, temperature)
