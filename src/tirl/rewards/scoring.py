"""Score finished trajectories: the task verdict on the assistant's text, then the recipe's shaping terms.

Each trajectory is routed by its problem (`data_source`, `ability`) through the registry to its verifier; verifiers
that need the sandbox grade their items in one sandbox batch each (code tests), the rest in parallel (batch.py). The verdict says what happened: correct, wrong, no_answer, timeout or error, so a timed-out check is
never mistaken for a wrong answer when reading results (its task score is still -1: the trainer needs a number).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tirl.data.records import ProblemRow
from tirl.rewards.batch import grade_many
from tirl.rewards.math import GradeResult
from tirl.rewards.registry import get_verifier, graded_by, verifier_name
from tirl.rewards.shaping import RewardConfig, shape_reward
from tirl.rollout.types import Trajectory
from tirl.sandbox.types import Sandbox


@dataclass
class TrajectoryScore:
    reward: float  # what the advantage estimator sees
    correct: bool
    pred: str | None
    parts: dict[str, float] = field(default_factory=dict)
    verdict: str = ""  # correct | wrong | no_answer | timeout | error
    details: dict[str, Any] = field(default_factory=dict)


def verdict(g: GradeResult) -> str:
    d = g.details or {}
    if d.get("timeout"):
        return "timeout"
    if "error" in d:
        return "error"
    if d.get("no_boxed") or d.get("no_code"):
        return "no_answer"
    return "correct" if g.correct else "wrong"


def _problem(t: Trajectory, i: int) -> ProblemRow:
    if t.problem is None:
        raise ValueError(
            f"trajectory {i} has no problem to grade against: roll it out with an Origin (AgentLoop.run origins=)"
        )
    return t.problem


def grade_trajectories(
    trajs: Sequence[Trajectory], config: RewardConfig, *, sandbox: Sandbox | None = None
) -> list[GradeResult]:
    """Task verdicts only (no shaping), graded from the model's own text: tool output is not searched."""
    problems = [_problem(t, i) for i, t in enumerate(trajs)]
    names = [graded_by(verifier_name(p.data_source, p.ability), config.grading) for p in problems]
    out: list[GradeResult | None] = [None] * len(trajs)
    boxed = [n for n in dict.fromkeys(names) if get_verifier(n).needs_sandbox]
    if boxed and sandbox is None:
        from tirl.sandbox import SandboxConfig, build_sandbox

        with build_sandbox(SandboxConfig()) as sb:
            return grade_trajectories(trajs, config, sandbox=sb)
    for name in boxed:  # one sandbox batch per verifier: every test of every answer runs in parallel
        v = get_verifier(name)
        idx = [i for i, n in enumerate(names) if n == name]
        graded = v.fn(
            [trajs[i].assistant_text for i in idx],
            [problems[i].ground_truth for i in idx],
            sandbox=sandbox,
            timeout_s=v.timeout_s or config.code_timeout_s,
        )
        for i, g in zip(idx, graded, strict=True):
            out[i] = g
    rest = [i for i, n in enumerate(names) if out[i] is None]
    items = [(names[i], trajs[i].assistant_text, problems[i].ground_truth) for i in rest]
    for i, g in zip(rest, grade_many(items, workers=config.workers, timeout_s=config.timeout_s), strict=True):
        out[i] = g
    return [g for g in out if g is not None]


def score_trajectories(
    trajs: Sequence[Trajectory], config: RewardConfig, *, max_len: int, sandbox: Sandbox | None = None
) -> list[TrajectoryScore]:
    scores = []
    for t, g in zip(trajs, grade_trajectories(trajs, config, sandbox=sandbox), strict=True):
        reward, parts = shape_reward(
            g.score,
            num_tool_calls=t.num_executed_calls,
            response_len=t.response_length,
            config=config,
            max_len=max_len,
        )
        scores.append(TrajectoryScore(reward, g.correct, g.pred, parts, verdict(g), dict(g.details)))
    return scores


def score_trajectory(traj: Trajectory, config: RewardConfig, *, max_len: int) -> TrajectoryScore:
    return score_trajectories([traj], config, max_len=max_len)[0]
