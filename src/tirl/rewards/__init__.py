"""Rewards: a verifier per data source (registry.py) grading a response against its ground truth, batch grading in
worker processes (batch.py), code tests in the sandbox (code.py), and shaping terms added on top (shaping.py)."""

from tirl.rewards.math import GradeResult, grade, last_boxed
from tirl.rewards.registry import Verifier, get_verifier, register, register_verifier, route, verifier_name
from tirl.rewards.shaping import RewardConfig, overlong_penalty, shape_reward, tool_call_term

__all__ = [
    "GradeResult",
    "Verifier",
    "get_verifier",
    "register_verifier",
    "route",
    "RewardConfig",
    "grade",
    "last_boxed",
    "overlong_penalty",
    "register",
    "shape_reward",
    "tool_call_term",
    "verifier_name",
]
