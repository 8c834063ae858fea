"""RL algorithm math as pure tensor functions: advantages, policy losses, regularizers.

Imports only torch and the standard library (tests/test_layers.py enforces it). Estimators and losses
are registered by name (`register_advantage`, `register_policy_loss`) with the dataclass of their settings
(`AdvantageOptions`, `LossOptions`: `rl.advantage.*`, `rl.loss.*`), so a variant is one function, its options and
one call.
"""

from .advantages import (
    ADVANTAGE_ESTIMATORS,
    AdvantageEstimator,
    AdvantageOptions,
    PassKOptions,
    check_advantage,
    default_advantage_options,
    equal_reward_groups,
    get_advantage_estimator,
    grpo,
    register_advantage,
    rloo,
)
from .losses import (
    AGGREGATIONS,
    POLICY_LOSSES,
    ClipOptions,
    GSPOOptions,
    LossOptions,
    PolicyLoss,
    PPOOptions,
    aggregate,
    default_loss_options,
    get_policy_loss,
    policy_loss,
    register_policy_loss,
)
from .regularizers import KL_ESTIMATORS, entropy_from_logits, kl_penalty

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "AGGREGATIONS",
    "KL_ESTIMATORS",
    "POLICY_LOSSES",
    "AdvantageEstimator",
    "AdvantageOptions",
    "ClipOptions",
    "GSPOOptions",
    "LossOptions",
    "PPOOptions",
    "PassKOptions",
    "PolicyLoss",
    "aggregate",
    "check_advantage",
    "default_advantage_options",
    "default_loss_options",
    "entropy_from_logits",
    "equal_reward_groups",
    "get_advantage_estimator",
    "get_policy_loss",
    "grpo",
    "kl_penalty",
    "policy_loss",
    "register_advantage",
    "register_policy_loss",
    "rloo",
]
