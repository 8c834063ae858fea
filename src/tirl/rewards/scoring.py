"""Score answers: the task verdict on a response's text against its problem row, then the recipe's shaping terms.

Each response is routed by its problem (`data_source`, `ability`) through the registry to its verifier; verifiers
that need the sandbox grade their items in one sandbox batch each (code tests), the rest in parallel (batch.py). The verdict says what happened: correct, wrong, no_answer, timeout or error, so a timed-out check is
never mistaken for a wrong answer when reading results (its task score is still -1: the trainer needs a number).
Nothing here knows a trajectory: whoever holds trajectories maps each to a `Response` (rollout/agent/episodes.py).
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
from tirl.sandbox.types import Sandbox


@dataclass(frozen=True)
class Response:
    """One answer to score: the model's own text (tool output is not searched), the problem it answers, and what
    the shaping terms charge for (executed tool calls, response tokens)."""

    text: str
    problem: ProblemRow
    tool_calls: int = 0
    length: int = 0


@dataclass
class Score:
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


def grade_responses(
    responses: Sequence[Response], config: RewardConfig, *, sandbox: Sandbox | None = None
) -> list[GradeResult]:
    """Task verdicts only (no shaping), in order."""
    problems = [r.problem for r in responses]
    names = [graded_by(verifier_name(p.data_source, p.ability), config.grading) for p in problems]
    out: list[GradeResult | None] = [None] * len(responses)
    boxed = [n for n in dict.fromkeys(names) if get_verifier(n).needs_sandbox]
    if boxed and sandbox is None:
        from tirl.sandbox import SandboxConfig, build_sandbox

        with build_sandbox(SandboxConfig()) as sb:
            return grade_responses(responses, config, sandbox=sb)
    for name in boxed:  # one sandbox batch per verifier: every test of every answer runs in parallel
        v = get_verifier(name)
        idx = [i for i, n in enumerate(names) if n == name]
        graded = v.fn(
            [responses[i].text for i in idx],
            [problems[i].ground_truth for i in idx],
            sandbox=sandbox,
            timeout_s=v.timeout_s or config.code_timeout_s,
        )
        for i, g in zip(idx, graded, strict=True):
            out[i] = g
    rest = [i for i, n in enumerate(names) if out[i] is None]
    items = [(names[i], responses[i].text, problems[i].ground_truth) for i in rest]
    for i, g in zip(rest, grade_many(items, workers=config.workers, timeout_s=config.timeout_s), strict=True):
        out[i] = g
    return [g for g in out if g is not None]


def score_responses(
    responses: Sequence[Response], config: RewardConfig, *, max_len: int, sandbox: Sandbox | None = None
) -> list[Score]:
    """Each response's verdict and its shaped reward, in order."""
    scores = []
    for r, g in zip(responses, grade_responses(responses, config, sandbox=sandbox), strict=True):
        reward, parts = shape_reward(
            g.score, num_tool_calls=r.tool_calls, response_len=r.length, config=config, max_len=max_len
        )
        scores.append(Score(reward, g.correct, g.pred, parts, verdict(g), dict(g.details)))
    return scores
