"""`tirl analyze` at the demo's size: 2 models x 200 problems x 8 samples, and at a larger 500 x 64.

Writes bench/results/analyze.json (or `--out`). Baseline in the same run: pass@k for every k and its bootstrap computed the
straightforward way (pass_at_k per problem and k; each replicate re-indexes the problems), against the
vectorised table and the multinomial-weights matrix product the analysis uses. Both give the same pass@k (asserted);
the intervals differ only by resampling noise (the two draw different replicates).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np

from bench.common import cli as common_cli
from tirl.data.records import ProblemRow
from tirl.eval.analysis import analyze_runs
from tirl.eval.bootstrap import bootstrap_curve, resample_weights
from tirl.eval.evaluate import SampleRecord, write_eval
from tirl.eval.metrics import pass_at_k, pass_at_k_table
from tirl.eval.report import run_analyze
from tirl.eval.samples import Run, Sample
from tirl.eval.tables import AnalysisConfig
from tirl.rollout.types import ToolCallRecord, Trajectory


def synthetic_run(
    label: str, problems: int, n: int, seed: int
) -> tuple[list[SampleRecord], list[Trajectory]]:
    rng = np.random.default_rng(seed)
    rates = rng.beta(0.7, 0.7, size=problems)
    recs, trajs = [], []
    for i, p in enumerate(rates):
        for k in range(n):
            ok = bool(rng.random() < p)
            ans = "42" if ok else str(rng.integers(0, 5))
            recs.append(
                SampleRecord(
                    label, f"q{i}", "bench", k, 1.0, 1.0, ok, 1.0 if ok else -1.0, ans, 1, 0, 2, 60, "answer"
                )
            )
            problem = ProblemRow(f"q{i}", "bench", [{"role": "user", "content": f"q{i}"}], "42")
            text = f"<tool_call>print(6 * 7)</tool_call>6 * 7 = 42 so \\boxed{{{ans}}}"
            trajs.append(Trajectory([1], [5] * 60, [1] * 40 + [0] * 10 + [1] * 10, [0.0] * 60, [text],
                                    [ToolCallRecord(1, "print(6 * 7)", "42\n", "ok")], "answer", problem))  # fmt: skip
    return recs, trajs


def naive_curves(
    correct_counts: np.ndarray, n: int, resamples: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    values = np.array([[pass_at_k(n, int(c), k) for k in range(1, n + 1)] for c in correct_counts])
    rng = np.random.default_rng(seed)
    reps = np.stack(
        [values[rng.integers(0, len(values), len(values))].mean(axis=0) for _ in range(resamples)]
    )
    return values.mean(axis=0), np.quantile(reps, [0.025, 0.975], axis=0)


def bench_curves(problems: int, n: int) -> dict:
    counts = np.random.default_rng(0).integers(0, n + 1, size=problems)
    t = time.perf_counter()
    mean_naive, _ = naive_curves(counts, n, 1000, 0)
    naive = time.perf_counter() - t
    t = time.perf_counter()
    ci = bootstrap_curve(pass_at_k_table(n, counts), resample_weights(problems, 1000, 0))
    fast = time.perf_counter() - t
    assert np.allclose(ci.mean, mean_naive)
    return {"problems": problems, "n": n, "naive_s": naive, "tirl_s": fast, "speedup": naive / fast}


def main() -> dict:
    out: dict = {"bootstrap": 1000}
    with tempfile.TemporaryDirectory() as tmp:
        dirs = []
        for j, label in enumerate(("sft", "rl")):
            recs, trajs = synthetic_run(label, 200, 8, seed=j)
            dirs.append(write_eval(Path(tmp) / label, recs, trajs, {}))
        t = time.perf_counter()
        report = run_analyze(dirs, Path(tmp) / "out", labels=["sft", "rl"])
        out["demo_size_end_to_end"] = {
            "problems": 200,
            "n": 8,
            "models": 2,
            "seconds": time.perf_counter() - t,
            "phases": report["seconds"],
        }
    samples = [Sample(r) for r in synthetic_run("big", 500, 64, seed=3)[0]]
    t = time.perf_counter()
    analyze_runs([Run("big", "-", "tirl", samples)], AnalysisConfig())
    out["analysis_500x64_one_model_s"] = time.perf_counter() - t
    out["pass@k_all_k_with_bootstrap"] = [bench_curves(200, 8), bench_curves(500, 64)]
    return out


def cli(argv: list[str] | None = None) -> None:
    common_cli("analyze", __doc__, lambda args: main(), argv)


if __name__ == "__main__":
    cli()
