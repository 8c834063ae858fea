"""Reward shaping terms, checked against hand-computed values."""

from __future__ import annotations

import pytest

from tirl.rewards.shaping import RewardConfig, overlong_penalty, shape_reward, tool_call_term


@pytest.mark.parametrize(("calls", "expected"), [(0, -1.0), (1, -0.9), (4, -0.6), (5, -0.6), (20, -0.6)])
def test_tool_call_term_wrong_answer(calls: int, expected: float) -> None:
    assert tool_call_term(-1.0, calls) == pytest.approx(expected)


@pytest.mark.parametrize("calls", [0, 1, 5])
def test_tool_call_term_keeps_correct_answer(calls: int) -> None:
    assert tool_call_term(1.0, calls) == 1.0
    assert tool_call_term(0.0, calls) == 0.0


def test_tool_call_term_custom_parameters() -> None:
    assert tool_call_term(-1.0, 2, per_call=0.25, cap=-0.2) == pytest.approx(-0.5)
    assert tool_call_term(-1.0, 4, per_call=0.25, cap=-0.2) == pytest.approx(-0.2)


@pytest.mark.parametrize(
    ("length", "expected"),
    [(0, 0.0), (936, 0.0), (960, 0.0), (961, -1 / 64), (992, -0.5), (1024, -1.0), (1025, -1.0), (5000, -1.0)],
)
def test_overlong_penalty_edges(length: int, expected: float) -> None:
    # max_len 1024, buffer 64: free up to 960, linear to -1 at 1024, clamped beyond
    assert overlong_penalty(length, max_len=1024, buffer=64) == pytest.approx(expected)


def test_overlong_penalty_factor() -> None:
    assert overlong_penalty(992, max_len=1024, buffer=64, penalty_factor=0.5) == pytest.approx(-0.25)
    assert overlong_penalty(2000, max_len=1024, buffer=64, penalty_factor=0.5) == pytest.approx(-0.5)
    assert overlong_penalty(100, max_len=100, buffer=100) == pytest.approx(
        -1.0
    )  # buffer == max_len is allowed


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_len": 100, "buffer": 0}, "buffer must be > 0"),
        ({"max_len": 100, "buffer": -5}, "buffer must be > 0"),
        ({"max_len": 100, "buffer": 101}, r"buffer \(101\) must be <= max_len \(100\)"),
    ],
)
def test_overlong_penalty_validation(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        overlong_penalty(50, **kwargs)


def test_tool_call_term_rejects_negative_calls() -> None:
    with pytest.raises(ValueError, match="num_tool_calls"):
        tool_call_term(-1.0, -1)


def test_shape_reward_all_off_is_identity() -> None:
    score, parts = shape_reward(
        -1.0, num_tool_calls=3, response_len=5000, config=RewardConfig(), max_len=1024
    )
    assert score == -1.0
    assert parts == {"reward/task": -1.0, "reward/tool_term": 0.0, "reward/overlong": 0.0}


def test_shape_reward_tool_term_only() -> None:
    cfg = RewardConfig(tool_call_bonus=True)
    score, parts = shape_reward(-1.0, num_tool_calls=2, response_len=10, config=cfg, max_len=1024)
    assert score == pytest.approx(-0.8)
    assert parts["reward/tool_term"] == pytest.approx(0.2)
    score, parts = shape_reward(1.0, num_tool_calls=2, response_len=10, config=cfg, max_len=1024)
    assert (score, parts["reward/tool_term"]) == (1.0, 0.0)


def test_shape_reward_both_terms_and_parts_sum() -> None:
    cfg = RewardConfig(tool_call_bonus=True, overlong=True, overlong_buffer=64)
    score, parts = shape_reward(-1.0, num_tool_calls=1, response_len=992, config=cfg, max_len=1024)
    assert score == pytest.approx(-1.4)  # -1 + 0.1 (one call) - 0.5 (halfway through the buffer)
    assert parts == pytest.approx({"reward/task": -1.0, "reward/tool_term": 0.1, "reward/overlong": -0.5})
    assert sum(parts.values()) == pytest.approx(score)


def test_shape_reward_config_max_len_overrides_budget() -> None:
    cfg = RewardConfig(overlong=True, overlong_buffer=10, overlong_max_len=100)
    score, parts = shape_reward(1.0, num_tool_calls=0, response_len=95, config=cfg, max_len=1024)
    assert score == pytest.approx(0.5)
    assert parts["reward/overlong"] == pytest.approx(-0.5)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"tool_call_per_call": -0.1}, "tool_call_per_call"),
        ({"tool_call_cap": 0.5}, "tool_call_cap"),
        ({"overlong_buffer": 0}, "overlong_buffer must be > 0"),
        ({"overlong_max_len": -1}, "overlong_max_len"),
        (
            {"overlong_max_len": 32, "overlong_buffer": 64},
            r"overlong_buffer \(64\) must be <= overlong_max_len",
        ),
        ({"overlong_penalty_factor": -1.0}, "overlong_penalty_factor"),
    ],
)
def test_reward_config_validation(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        RewardConfig(**kwargs)
