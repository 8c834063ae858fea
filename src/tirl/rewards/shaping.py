"""Reward shaping on top of a task score: a tool-use term for wrong answers, DAPO's soft overlong penalty.

Each term is a small pure function of numbers; `shape_reward` adds the enabled ones and reports every part as
a flat metric, so a run shows how much of its reward came from shaping. Not here: grading (see math.py).
"""

from __future__ import annotations

from tirl.rewards.config import RewardConfig


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
