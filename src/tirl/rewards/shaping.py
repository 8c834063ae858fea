"""Reward shaping on top of a task score: a tool-use term for wrong answers, DAPO's soft overlong penalty.

Each term is a small pure function of numbers; `shape_reward` adds the enabled ones and reports every part as
a flat metric, so a run shows how much of its reward came from shaping. Not here: grading (see math.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tirl.core.config import MAX_PROCESSES, MAX_TOKENS, check_counts


def tool_call_term(score: float, num_tool_calls: int, *, per_call: float = 0.1, cap: float = -0.6) -> float:
    """A wrong answer (score < 0) earns `per_call` per tool call, never above `cap`; a right one is unchanged.

    The reference recipe's nudge towards trying the tool early in training; the cap keeps any wrong answer
    below every right one, so calling the tool many times cannot pay off by itself.
    """
    if num_tool_calls < 0:
        raise ValueError(f"num_tool_calls must be >= 0, got {num_tool_calls}")
    if score < 0:
        return min(cap, score + per_call * num_tool_calls)
    return score


def overlong_penalty(length: int, *, max_len: int, buffer: int, penalty_factor: float = 1.0) -> float:
    """DAPO soft overlong punishment: 0 up to max_len - buffer, then linear to -penalty_factor at max_len."""
    if buffer <= 0:
        raise ValueError(f"overlong buffer must be > 0, got {buffer}")
    if buffer > max_len:
        raise ValueError(f"overlong buffer ({buffer}) must be <= max_len ({max_len})")
    if length < 0:
        raise ValueError(f"length must be >= 0, got {length}")
    expected = max_len - buffer
    if length <= expected:
        return 0.0
    return -min(1.0, (length - expected) / buffer) * penalty_factor


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


def shape_reward(
    base_score: float, *, num_tool_calls: int, response_len: int, config: RewardConfig, max_len: int
) -> tuple[float, dict[str, float]]:
    """Final reward and its parts, which sum to it (`reward/tool_term` is the change the tool term makes)."""
    tool = 0.0
    if config.tool_call_bonus:
        if config.tool_call_count == "reference":  # (num_turns - 2) / 2 calls with num_turns = 0
            shaped = (
                min(config.tool_call_cap, base_score - config.tool_call_per_call)
                if base_score < 0
                else base_score
            )
        else:
            shaped = tool_call_term(
                base_score, num_tool_calls, per_call=config.tool_call_per_call, cap=config.tool_call_cap
            )
        tool = shaped - base_score
    over = 0.0
    if config.overlong:
        over = overlong_penalty(
            response_len,
            max_len=config.overlong_max_len or max_len,
            buffer=config.overlong_buffer,
            penalty_factor=config.overlong_penalty_factor,
        )
    parts = {"reward/task": float(base_score), "reward/tool_term": tool, "reward/overlong": over}
    return base_score + tool + over, parts
