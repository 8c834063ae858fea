"""Score finished trajectories: the task verdict on the assistant's text, then the recipe's shaping terms."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from tirl.rewards.math import grade
from tirl.rewards.shaping import RewardConfig, shape_reward
from tirl.rollout.types import Trajectory


@dataclass
class TrajectoryScore:
    reward: float  # what the advantage estimator sees
    correct: bool
    pred: str | None
    parts: dict[str, float] = field(default_factory=dict)


def score_trajectory(traj: Trajectory, config: RewardConfig, *, max_len: int) -> TrajectoryScore:
    """Grades the model's own text (tool output is not searched for an answer) against meta['ground_truth']."""
    if "ground_truth" not in traj.meta:
        raise KeyError("trajectory meta has no 'ground_truth' to grade against")
    g = grade(traj.assistant_text, str(traj.meta["ground_truth"]))
    reward, parts = shape_reward(
        g.score,
        num_tool_calls=traj.num_executed_calls,
        response_len=traj.response_length,
        config=config,
        max_len=max_len,
    )
    return TrajectoryScore(reward, g.correct, g.pred, parts)


def score_trajectories(
    trajs: Sequence[Trajectory], config: RewardConfig, *, max_len: int
) -> list[TrajectoryScore]:
    return [score_trajectory(t, config, max_len=max_len) for t in trajs]
