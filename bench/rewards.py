"""Grading throughput: math (the 188 MATH-500 reference solutions whose answers need math-verify) and code (HumanEval canonical
solutions through the sandbox), with one worker and with all cores.

Writes bench/results/rewards.json (or `--out`). Math "workers" are grading processes (tirl.rewards.batch); code "workers" are
concurrent sandbox runs (SandboxConfig.max_workers). Every grade must come out correct, so a speed-up that breaks
grading cannot go unnoticed.
"""

from __future__ import annotations

import json
import os
import time

from bench.common import cli as common_cli
from tirl.rewards.batch import grade_many
from tirl.rewards.code import grade_code_batch
from tirl.rewards.registry import get_verifier
from tirl.sandbox import SandboxConfig, build_sandbox
from tirl.tasks.benchmarks import prepare_humaneval, prepare_math500


def bench_math(workers: int) -> dict:
    rows = prepare_math500("recipe")
    items = [("math", r["extra_info"]["solution"], r["reward_model"]["ground_truth"]) for r in rows]
    # only the answers that need math-verify: plain integers are compared inline, without sympy or workers
    is_fast = get_verifier("math").is_fast
    items = [it for it in items if not is_fast(it[1], it[2])]
    grade_many(items[: workers * 2], workers=workers)  # start and warm the worker processes
    t = time.perf_counter()
    graded = grade_many(items, workers=workers, timeout_s=10)
    dt = time.perf_counter() - t
    assert all(g.correct for g in graded), "a MATH-500 reference solution graded wrong"
    return {
        "workers": workers,
        "items": len(items),
        "grades_per_s": len(items) / dt,
        "seconds": dt,
    }


def bench_code(workers: int) -> dict:
    rows = prepare_humaneval("recipe")
    answers = [
        "```python\n"
        + json.loads(r["reward_model"]["ground_truth"])["prompt"]
        + r["extra_info"]["canonical_solution"]
        + "```"
        for r in rows
    ]
    truths = [r["reward_model"]["ground_truth"] for r in rows]
    with build_sandbox(SandboxConfig(max_workers=workers)) as sb:
        grade_code_batch(answers[:workers], truths[:workers], sandbox=sb, timeout_s=10)  # warm-up
        t = time.perf_counter()
        graded = grade_code_batch(answers, truths, sandbox=sb, timeout_s=10)
        dt = time.perf_counter() - t
    assert all(g.correct for g in graded), "a HumanEval canonical solution graded wrong"
    return {"workers": workers, "items": len(rows), "grades_per_s": len(rows) / dt, "seconds": dt}


def main() -> dict:
    cores = os.cpu_count() or 1
    out = {"cores": cores}
    for name, fn in (("math", bench_math), ("code", bench_code)):
        single, multi = fn(1), fn(cores)
        out[name] = {
            "single": single,
            "all_cores": multi,
            "speedup": multi["grades_per_s"] / single["grades_per_s"],
        }
    return out


def cli(argv: list[str] | None = None) -> None:
    common_cli("rewards", __doc__, lambda args: main(), argv)


if __name__ == "__main__":
    cli()
