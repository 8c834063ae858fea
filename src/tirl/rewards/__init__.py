"""Rewards: grading a response against its ground truth, and shaping terms added on top."""

from tirl.rewards.math import GradeResult, grade, last_boxed
from tirl.rewards.shaping import RewardConfig, overlong_penalty, shape_reward, tool_call_term

__all__ = [
    "GradeResult",
    "RewardConfig",
    "grade",
    "last_boxed",
    "overlong_penalty",
    "shape_reward",
    "tool_call_term",
]
