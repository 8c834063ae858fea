"""RL algorithm math as pure tensor functions: advantages, policy losses, regularizers.

Imports only torch and the standard library (tests/test_layers.py enforces it).
"""

from .advantages import (
    ADVANTAGE_ESTIMATORS,
    AdvantageEstimator,
    equal_reward_groups,
    get_advantage_estimator,
    grpo,
    rloo,
)
from .losses import AGGREGATIONS, POLICY_LOSSES, PolicyLoss, aggregate, get_policy_loss, policy_loss
from .regularizers import KL_ESTIMATORS, entropy_from_logits, kl_penalty

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "AGGREGATIONS",
    "KL_ESTIMATORS",
    "POLICY_LOSSES",
    "AdvantageEstimator",
    "PolicyLoss",
    "aggregate",
    "entropy_from_logits",
    "equal_reward_groups",
    "get_advantage_estimator",
    "get_policy_loss",
    "grpo",
    "kl_penalty",
    "policy_loss",
    "rloo",
]
