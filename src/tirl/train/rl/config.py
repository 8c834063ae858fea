"""`rl:` of a run's config: GRPO-TCR's settings with the reference recipe's defaults, checked when loaded (a bad
value fails at start-up, naming the valid ones, not after the first rollout). The loop that reads them is
`tirl.train.rl.trainer`. The estimator's and the loss's own settings are not here: `rl.advantage.*` and `rl.loss.*` are
the options dataclasses registered with them (`tirl.algorithms`), built by name as `task.*` is. The KL penalty,
the validation during training and the rollout correction are sections of their own (`rl.kl.*`,
`rl.validation.*`, `rl.correction.*`, `rl.stream.*`); the batching and checkpoint keys stay flat, the same keys as `sft.*`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from tirl.algorithms import (
    AdvantageOptions,
    LossOptions,
    check_advantage,
    default_advantage_options,
    default_loss_options,
)
from tirl.algorithms.rollout_correction import CORRECTIONS
from tirl.core.bounds import (
    MAX_BATCH_TOKENS,
    MAX_COUNT,
    MAX_IN_FLIGHT,
    MAX_STEPS,
    check_counts,
    check_product,
    check_range,
)
from tirl.train.config import OptimConfig, check_micro_batch
from tirl.train.rl.overlap import check_off_policy

# the flat keys of rl.* before the estimator and the loss carried their own settings -> their new keys
MOVED_TO_VARIANTS = {
    "adv_estimator": "rl.advantage.name",
    "passk_k": "rl.advantage.k",
    "policy_loss": "rl.loss.name",
    "clip_low": "rl.loss.clip_low",
    "clip_high": "rl.loss.clip_high",
    "clip_c": "rl.loss.clip_c",
    "loss_agg": "rl.loss.agg",
    "loss_norm_len": "rl.loss.norm_len",
    "token_mean": "rl.loss.token_mean",
}
# the flat keys of rl.* before the KL penalty, the validation and the rollout correction had sections of their own
MOVED_TO_SECTIONS = {
    "kl_coef": "rl.kl.coef",
    "kl_estimator": "rl.kl.estimator",
    "eval_every": "rl.validation.every",
    "eval_data": "rl.validation.data",
    "eval_at_start": "rl.validation.at_start",
    "rollout_correction": "rl.correction.mode",
    "tis_cap": "rl.correction.tis_cap",
    "mis_low": "rl.correction.mis_low",
    "mis_high": "rl.correction.mis_high",
}


@dataclass
class KLConfig:
    """`rl.kl.*`: a penalty toward the initial policy in the loss (off by default, as in the recipe: no reference
    model is loaded then)."""

    coef: float = 0.0
    estimator: Literal["k1", "k3"] = "k3"

    def __post_init__(self) -> None:
        check_range("rl.kl.coef", self.coef, 0)  # at load time, not after a rollout


@dataclass
class ValidationConfig:
    """`rl.validation.*`: held-out benchmark files sampled during training (eval.n samples each; records kept in
    OUT/eval/step-<k>/)."""

    every: int = 0  # steps between validations; 0 = none
    data: list[str] = field(default_factory=list)  # benchmark files
    at_start: bool = False  # validate before the first step too (verl's val_before_train)

    def __post_init__(self) -> None:
        if self.every < 0 or (self.every and not self.data):
            raise ValueError(
                f"rl.validation.every={self.every} needs rl.validation.data (a list of benchmark files) and must be "
                ">= 0"
            )
        check_counts(self, "rl.validation", {"every": (0, MAX_STEPS)})


@dataclass
class CorrectionConfig:
    """`rl.correction.*`: the engine/trainer log-prob mismatch (`tirl.algorithms.rollout_correction`)."""

    # auto = none for an engine that shares the policy module (the torch engine), token_tis otherwise
    # (tirl.rollout.capabilities says why)
    mode: Literal["auto", "none", "token_tis", "seq_mis"] = "auto"
    tis_cap: float = 2.0  # token_tis: weights min(pi_old / pi_rollout, cap) (verl's rollout_is_threshold)
    # seq_mis: sequences whose ratio is outside [mis_low, mis_high] are masked (TRL's 0, 3)
    mis_low: float = 0.0
    mis_high: float = 3.0

    def __post_init__(self) -> None:
        if self.mode not in ("auto", *CORRECTIONS):
            raise ValueError(f"rl.correction.mode={self.mode!r}; valid: auto, {', '.join(CORRECTIONS)}")
        check_range("rl.correction.mis_low", self.mis_low, 0)
        check_range("rl.correction.tis_cap", self.tis_cap, 0, low_open=True)
        check_range(
            "rl.correction.mis_high",
            self.mis_high,
            self.mis_low,
            low_open=True,
            low_name="rl.correction.mis_low",
        )


# updates a group may lag: the buffer holds (K + 1) steps of groups (streaming RL runs K <= 4)
MAX_STALENESS = 1024


@dataclass
class StreamConfig:
    """`rl.stream.*`: streaming RL (`tirl.train.rl.stream`): groups sampled continuously while the trainer updates, a
    batch taken as soon as enough are finished, groups more than `max_staleness` updates old dropped."""

    enabled: bool = False
    max_staleness: int = (
        1  # K: a group whose oldest token is more than K updates old is dropped (0: synchronous)
    )
    # groups finished or in flight at most, on each rank; 0 = (max_staleness + 1) x the rank's prompts per step
    buffer_groups: int = 0
    partial: bool = (
        False  # a sync interrupts the requests in flight, which go on from their tokens with new weights
    )

    def __post_init__(self) -> None:
        if self.max_staleness < 0 or self.buffer_groups < 0:
            raise ValueError(
                f"rl.stream.max_staleness={self.max_staleness} and rl.stream.buffer_groups={self.buffer_groups} "
                "must be >= 0"
            )
        if self.partial and not self.enabled:
            raise ValueError("rl.stream.partial=true needs rl.stream.enabled=true")
        bounds = {"max_staleness": (0, MAX_STALENESS), "buffer_groups": (0, MAX_COUNT)}
        check_counts(self, "rl.stream", bounds)

    def capacity(self, local_groups: int) -> int:
        """Groups the buffer holds at most, for `local_groups` groups per step on this rank."""
        return self.buffer_groups or (self.max_staleness + 1) * local_groups


@dataclass
class RLConfig:
    MOVED_KEYS: ClassVar[dict[str, str]] = {**MOVED_TO_VARIANTS, **MOVED_TO_SECTIONS}
    # what the moved keys meant when a config left them out: `tirl config migrate` writes these where the new
    # variant's own default differs (rl.policy_loss=gspo ran with 0.2 / 0.28, GSPOOptions' default is 3e-4 / 4e-4)
    MOVED_DEFAULTS: ClassVar[dict[str, Any]] = {
        "adv_estimator": "grpo",
        "passk_k": 4,
        "policy_loss": "ppo",
        "clip_low": 0.2,
        "clip_high": 0.28,
        "clip_c": 10.0,
        "loss_agg": "token-mean",
        "loss_norm_len": 0,
        "token_mean": "exact",
    }

    data: str = ""  # JSONL of RL rows (verl schema: prompt, reward_model.ground_truth, ...)
    steps: int = 20
    prompts_per_step: int = 32
    n: int = 8  # rollouts per prompt (the GRPO group size G)
    mini_batch_size: int = 64  # trajectories per optimizer update
    micro_batch_size: int = 0  # trajectories per forward/backward (gradients accumulate); 0 = the mini-batch
    # padded tokens per forward/backward: auto = sized from model.activation_gib (tirl.train.memory); 0 = none
    micro_batch_tokens: int | Literal["auto"] = "auto"
    ppo_epochs: int = 1
    # the estimator by name and its own settings (rl.advantage.name picks the dataclass: tirl.algorithms)
    advantage: AdvantageOptions = field(default_factory=default_advantage_options)
    # the policy loss by name and its own settings (rl.loss.name picks the dataclass: tirl.algorithms)
    loss: LossOptions = field(default_factory=default_loss_options)
    prompt_rewrite: Literal["none", "verl"] = "none"  # verl: the recipe's rl.data rewrite (recipe_prompts.py)
    kl: KLConfig = field(default_factory=KLConfig)
    entropy_coef: float = 0.0
    # DAPO: drop groups whose rewards are all equal, sample more prompts to refill
    dynamic_sampling: bool = False
    dynamic_max_rounds: int = 3  # extra generation rounds per step at most, when dynamic_sampling is on
    overlong_filter: bool = False  # truncated responses (budget / turn cap hit) are masked out of the loss
    logprob_batch_size: int = 64  # sequences per no-grad forward when recomputing old log-probs
    # a group's rollouts run their prompt once per forward pass, its keys and values shared (tirl.train.prefix)
    share_prefix: bool = True
    # auto: the engine's sampling log-probs when they are the trainer's own (capabilities.old_logprobs); recompute:
    # always a no-grad pass (measures the engine/trainer mismatch)
    old_logprobs: Literal["auto", "recompute"] = "auto"
    validation: ValidationConfig = field(default_factory=ValidationConfig)
    log_samples: int = 2  # trajectories per step logged as text (JSONL samples file, TensorBoard, wandb)
    save_every: int = 0  # steps between resumable checkpoints (checkpoint-<step>/); 0 = only the final model
    keep_last: int = 0  # complete checkpoints kept, oldest deleted first, never the newest; 0 = all
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-6, weight_decay=0.01, grad_clip=1.0))
    correction: CorrectionConfig = field(default_factory=CorrectionConfig)
    # 1: step k+1's rollouts are sampled with step k's weights while step k's update runs (tirl.train.rl.overlap)
    off_policy_steps: int = 0
    stream: StreamConfig = field(default_factory=StreamConfig)

    def __post_init__(self) -> None:
        for name in ("steps", "prompts_per_step", "n", "mini_batch_size", "ppo_epochs", "logprob_batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        adv = self.advantage  # its name and settings were checked as it was built (tirl.algorithms)
        if self.n < 2:
            raise ValueError(
                f"rl.n={self.n}: every prompt would form a group of one, and the group-relative estimator "
                f"{adv.name!r} has no baseline there, so every advantage is 0 and the run learns nothing; "
                "use rl.n >= 2 (the recipe samples 16 per prompt)"
            )
        try:  # the estimator's own check of its hyperparameters against the group size
            check_advantage(adv.name, group_size=self.n, **adv.hyperparameters())
        except ValueError as e:
            own = "".join(f", rl.advantage.{k}={v}" for k, v in adv.hyperparameters().items())
            raise ValueError(f"rl.advantage.name={adv.name!r} with rl.n={self.n}{own}: {e}") from None
        if self.save_every < 0 or self.keep_last < 0:
            raise ValueError(
                f"save_every and keep_last must be >= 0, got {self.save_every}, {self.keep_last}"
            )
        if self.dynamic_max_rounds < 0:
            raise ValueError(f"dynamic_max_rounds must be >= 0, got {self.dynamic_max_rounds}")
        check_micro_batch(self.micro_batch_size, self.micro_batch_tokens)
        if self.old_logprobs not in ("auto", "recompute"):
            raise ValueError(f"rl.old_logprobs={self.old_logprobs!r}; valid: auto, recompute")
        check_range("entropy_coef", self.entropy_coef)  # at load time, not after a rollout
        check_off_policy(self.off_policy_steps, dynamic_sampling=self.dynamic_sampling)
        if self.stream.enabled and (self.off_policy_steps or self.dynamic_sampling):
            raise ValueError(
                "rl.stream.enabled with rl.off_policy_steps=1 or rl.dynamic_sampling: streaming already samples "
                "during the update, and refilling rounds would draw prompts while it runs; use one of them"
            )
        self._check_counts()

    def _check_counts(self) -> None:
        """Every count at most what a run can hold (`tirl.core.bounds.MAX_*`), and the trajectories a step holds."""
        check_counts(
            self,
            "rl",
            {
                "steps": (1, MAX_STEPS),
                "prompts_per_step": (1, MAX_COUNT),
                "n": (1, MAX_COUNT),
                "mini_batch_size": (1, MAX_IN_FLIGHT),
                "micro_batch_size": (0, MAX_IN_FLIGHT),
                "micro_batch_tokens": (0, MAX_BATCH_TOKENS),
                "ppo_epochs": (1, MAX_COUNT),
                "dynamic_max_rounds": (0, MAX_COUNT),
                "logprob_batch_size": (1, MAX_IN_FLIGHT),
                "log_samples": (0, MAX_IN_FLIGHT),
                "save_every": (0, MAX_STEPS),
                "keep_last": (0, MAX_STEPS),
            },
        )
        fix = "lower rl.prompts_per_step"
        check_product(
            ("rl.prompts_per_step", "rl.n"),
            (self.prompts_per_step, self.n),
            MAX_IN_FLIGHT,
            "trajectories a step samples and holds",
            fix,
        )
        if self.stream.enabled:  # the buffer holds its groups' trajectories, finished or in flight
            groups = self.stream.capacity(self.prompts_per_step)
            named = "rl.stream.buffer_groups"
            if not self.stream.buffer_groups:
                named = "(rl.stream.max_staleness + 1) x rl.prompts_per_step"
            check_product(
                (named, "rl.n"),
                (groups, self.n),
                MAX_IN_FLIGHT,
                "trajectories the stream buffer holds",
                f"{fix} or rl.stream.max_staleness, or set a smaller rl.stream.buffer_groups",
            )


__all__ = [
    "MOVED_TO_SECTIONS",
    "MOVED_TO_VARIANTS",
    "CorrectionConfig",
    "KLConfig",
    "RLConfig",
    "StreamConfig",
    "ValidationConfig",
]
