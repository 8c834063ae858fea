"""`reward:` of a run's config: the shaping terms on top of the verifier's score (`tirl.rewards.shaping`) and how
answers are graded (workers, time limits, `grading`), checked when loaded."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tirl.core.bounds import MAX_PROCESSES, MAX_TOKENS, check_counts


@dataclass
class RewardConfig:
    tool_call_bonus: bool = False
    tool_call_per_call: float = 0.1
    tool_call_cap: float = -0.6
    # "executed": count the calls that ran and whose results the model saw (the paper's intent). "reference": what
    # the reference implementation does in practice: its `dapo` reward manager never passes num_turns, so the
    # term is computed with num_turns = 0, i.e. -1 call, and every wrong answer scores min(cap, -1.1) = -1.1.
    tool_call_count: Literal["executed", "reference"] = "executed"
    overlong: bool = False
    overlong_buffer: int = 64
    overlong_max_len: int = 0  # 0 = the rollout's response budget, passed to shape_reward as max_len
    overlong_penalty_factor: float = 1.0
    workers: int = 0  # processes grading math/choice answers in parallel; 0 = all cores
    timeout_s: float = 5.0  # per math check (math-verify); a check over it is reported as a timeout
    code_timeout_s: float = 10.0  # per code test run in the sandbox
    # verify: math-verify equivalence, lenient letter forms (tirl); math_dapo: the recipe's strict exact match of
    # the last \boxed{} in the last 100 characters, for math and multiple choice alike (tirl.rewards.strict)
    grading: Literal["verify", "math_dapo"] = "verify"

    def __post_init__(self) -> None:
        if self.workers < 0 or self.timeout_s <= 0 or self.code_timeout_s <= 0:
            raise ValueError(
                f"reward.workers must be >= 0 and timeouts > 0, got {self.workers}, {self.timeout_s}, "
                f"{self.code_timeout_s}"
            )
        check_counts(self, "reward", {
            "overlong_buffer": (0, MAX_TOKENS), "overlong_max_len": (0, MAX_TOKENS), "workers": (0, MAX_PROCESSES),
        })  # fmt: skip
        if self.grading not in ("verify", "math_dapo"):
            raise ValueError(f"reward.grading must be 'verify' or 'math_dapo', got {self.grading!r}")
        if self.tool_call_per_call < 0:
            raise ValueError(f"tool_call_per_call must be >= 0, got {self.tool_call_per_call}")
        if self.tool_call_cap > 0:
            raise ValueError(
                f"tool_call_cap must be <= 0 (a wrong answer must not earn a positive reward), "
                f"got {self.tool_call_cap}"
            )
        if self.tool_call_count not in ("executed", "reference"):
            raise ValueError(
                f"tool_call_count must be 'executed' or 'reference', got {self.tool_call_count!r}"
            )
        if self.overlong_buffer <= 0:
            raise ValueError(f"overlong_buffer must be > 0, got {self.overlong_buffer}")
        if self.overlong_max_len < 0:
            raise ValueError(
                f"overlong_max_len must be >= 0 (0 = response budget), got {self.overlong_max_len}"
            )
        if 0 < self.overlong_max_len < self.overlong_buffer:
            raise ValueError(
                f"overlong_buffer ({self.overlong_buffer}) must be <= "
                f"overlong_max_len ({self.overlong_max_len})"
            )
        if self.overlong_penalty_factor < 0:
            raise ValueError(f"overlong_penalty_factor must be >= 0, got {self.overlong_penalty_factor}")
