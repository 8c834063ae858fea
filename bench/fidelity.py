"""How far apart tirl's numbers and the recipe's are on the same samples: an evaluation's trajectories graded both ways
(`reward.grading`: math-verify vs math_dapo strict) and summarised both ways (unbiased pass@k and exact maj@k vs verl's
bootstrap best@k and maj@k).

    python -m bench.fidelity EVAL_DIR [EVAL_DIR ...] [--out bench/results/fidelity.json]

Each EVAL_DIR is a `tirl eval` output (trajectories.jsonl), e.g. the demo's eval-sft/ and eval-rl/. Nothing is re-sampled: every number
comes from the stored samples, so the differences are the grader's and the estimator's alone.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

from bench.common import result_path, write_result
from tirl.eval.answers import canonical_answers
from tirl.eval.metrics import default_ks, summarize
from tirl.eval.verl_metrics import bootstrap_summary
from tirl.rewards.scoring import grade_responses
from tirl.rewards.shaping import RewardConfig
from tirl.rollout.agent.episodes import responses_of
from tirl.rollout.types import Trajectory


def load(eval_dir: Path) -> list[Trajectory]:
    lines = (eval_dir / "trajectories.jsonl").read_text(encoding="utf-8").splitlines()
    return [Trajectory.from_dict(json.loads(line)) for line in lines if line.strip()]


def summary(trajs: list[Trajectory], grading: str) -> dict[str, float]:
    """Both kinds of metrics over all problems, the samples graded with `grading`."""
    grades = grade_responses(responses_of(trajs), RewardConfig(grading=grading, workers=1))
    problems: dict[tuple[str, str], tuple[list[bool], list[str | None]]] = defaultdict(lambda: ([], []))
    for t, g in zip(trajs, grades, strict=True):
        assert t.problem is not None, "eval trajectories name their problem"
        key = (t.problem.data_source, t.problem.problem_id)
        problems[key][0].append(g.correct)
        problems[key][1].append(g.pred)
    n = len(next(iter(problems.values()))[0])
    ks = default_ks(n)
    out = summarize({f"{s}/{p}": (c, canonical_answers(a, s)) for (s, p), (c, a) in problems.items()}, ks)
    boot = [bootstrap_summary(c, a, ks) for c, a in problems.values()]
    out.update({key: sum(b[key] for b in boot) / len(boot) for key in boot[0]})
    return out


def report(eval_dir: Path) -> dict:
    trajs = load(eval_dir)
    result: dict = {"eval_dir": str(eval_dir), "samples": len(trajs)}
    result.update({grading: summary(trajs, grading) for grading in ("verify", "math_dapo")})
    n = int(result["verify"]["samples_per_problem"])
    print(f"{eval_dir}: {len(trajs)} samples, {int(result['verify']['num_problems'])} problems x {n}")
    print(f"  {'grading':<10} {'avg@n':>7} {f'pass@{n}':>8} {f'bootstrap_best@{n}':>18} {f'maj@{n}':>7} "
          f"{f'bootstrap_maj@{n}':>17}")  # fmt: skip
    for grading in ("verify", "math_dapo"):
        s = result[grading]
        print(f"  {grading:<10} {s['avg@n']:>7.3f} {s[f'pass@{n}']:>8.3f} {s[f'bootstrap_best@{n}']:>18.3f} "
              f"{s[f'maj@{n}']:>7.3f} {s[f'bootstrap_maj@{n}']:>17.3f}")  # fmt: skip
    return result


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.fidelity", description=__doc__.splitlines()[0])
    p.add_argument("eval_dirs", type=Path, nargs="+")
    p.add_argument("--out", type=Path, default=result_path("fidelity"))
    args = p.parse_args()
    write_result(args.out, {"runs": [report(d) for d in args.eval_dirs]})
    print(f"written {args.out}")


if __name__ == "__main__":
    main()
