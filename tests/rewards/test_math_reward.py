"""Math grading: boxed-answer extraction, equivalence, and the off-main-thread timeout path."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tirl.rewards import math as math_reward
from tirl.rewards.math import GradeResult, grade, last_boxed


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"so \boxed{42}.", "42"),
        (r"\boxed{\frac{\sqrt{2}}{2}}", r"\frac{\sqrt{2}}{2}"),
        (r"first \boxed{1} then \boxed{2}", "2"),
        (r"\fbox{7}", "7"),
        (r"\boxed {x+1}", "x+1"),
        (r"\boxed{\{1, 2\}}", r"\{1, 2\}"),  # escaped braces are not grouping
        (r"\boxed{\boxed{5}}", "5"),
        ("no answer here", None),
        (r"\boxed{\frac{1}{2}", None),  # unbalanced
        (r"\boxed{3} and finally \boxed{4", None),  # the last one is cut off: no answer, not the earlier one
    ],
)
def test_last_boxed(text: str, expected: str | None) -> None:
    assert last_boxed(text) == expected


@pytest.mark.parametrize(
    ("response", "gold", "correct"),
    [
        (r"The answer is \boxed{25}.", "25", True),
        (r"The answer is \boxed{26}.", "25", False),
        (r"\boxed{25}", "025", True),  # AIME zero padding
        (r"\boxed{-3}", "-3", True),
        (r"\boxed{1,000}", "1000", True),
        (r"\boxed{1,2}", "12", False),  # a list, not a thousands separator
        (r"\boxed{0.5}", r"\frac{1}{2}", True),
        (r"\boxed{\frac{3}{4}}", "3/4", True),
        (r"\boxed{\frac{3}{4}}", "4/3", False),
        (r"\boxed{\frac{\sqrt{2}}{2}}", r"\frac{1}{\sqrt{2}}", True),
        (r"\boxed{\frac{\sqrt{2}}{2}}", r"\sqrt{2}", False),
        (r"\boxed{2}", r"$\frac{4}{2}$", True),  # gold already in math mode
        (r"first \boxed{3}, no wait: \boxed{5}", "5", True),
        (r"first \boxed{5}, no wait: \boxed{3}", "5", False),
    ],
)
def test_grade(response: str, gold: str, correct: bool) -> None:
    result = grade(response, gold)
    assert result.correct is correct
    assert result.score == (1.0 if correct else -1.0)
    assert result.pred == last_boxed(response)


def test_no_boxed_scores_minus_one() -> None:
    assert grade("I think it is 25", "25") == GradeResult(-1.0, False, None, {"no_boxed": True})


def test_unbalanced_boxed_scores_minus_one() -> None:
    result = grade(r"\boxed{\frac{1}{2}", "1/2")
    assert (result.score, result.pred) == (-1.0, None)


CASES = [
    (r"\boxed{0.5}", r"\frac{1}{2}"),
    (r"\boxed{\frac{3}{4}}", "3/4"),
    (r"\boxed{\frac{\sqrt{2}}{2}}", r"\frac{1}{\sqrt{2}}"),
    (r"\boxed{x^2}", "3"),
    (r"\boxed{025}", "25"),
]


def test_worker_thread_matches_main_thread() -> None:
    on_main = [grade(r, g) for r, g in CASES]
    with ThreadPoolExecutor(max_workers=2) as pool:
        on_threads = list(pool.map(lambda c: grade(*c), CASES))
    assert on_threads == on_main
    assert [r.correct for r in on_main] == [True, True, True, False, True]


def test_worker_timeout_kills_and_replaces_the_worker() -> None:
    pool = math_reward._get_pool()
    workers = list(pool._processes.values())
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        math_reward._call_with_timeout(time.sleep, (30,), 0.2)
    assert time.monotonic() - t0 < 2.0
    for proc in workers:
        proc.join(timeout=5)
        assert not proc.is_alive()
    assert math_reward._get_pool() is not pool
    with ThreadPoolExecutor(max_workers=1) as ex:  # grading works again on the fresh worker
        assert ex.submit(grade, r"\boxed{0.5}", r"\frac{1}{2}").result().correct


def test_grade_reports_timeout_off_main_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    def too_slow(fn: object, args: tuple, timeout_s: float) -> object:
        raise TimeoutError("simulated")

    monkeypatch.setattr(math_reward, "_call_with_timeout", too_slow)
    with ThreadPoolExecutor(max_workers=1) as ex:
        result = ex.submit(grade, r"\boxed{\frac{1}{2}}", "0.5").result()
    assert result == GradeResult(-1.0, False, r"\frac{1}{2}", {"timeout": True})


def test_grade_reports_timeout_on_main_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    def alarm(*args: object) -> object:
        raise math_reward.TimeoutException("simulated")

    monkeypatch.setattr(math_reward, "_verify_texts", alarm)
    assert grade(r"\boxed{\frac{1}{2}}", "0.5").details == {"timeout": True}


def test_math_verify_error_becomes_a_wrong_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(text: str, **kwargs: object) -> object:
        raise RuntimeError("parser exploded")

    monkeypatch.setattr(math_reward, "parse", broken)
    result = grade(r"\boxed{\frac{1}{2}}", "0.5")
    assert (result.score, result.correct) == (-1.0, False)
    assert "parser exploded" in result.details["error"]


def test_the_grading_worker_outlives_the_stop_signals_its_group_gets() -> None:
    """torchrun's SIGTERM and a terminal's Ctrl-C reach the whole process group: the grading worker ignores both
    (its parent ends it), so a trainer finishing its step before it checkpoints can still grade."""
    import os
    import signal

    pool = math_reward._get_pool()
    assert grade(r"\boxed{4}", "4").correct
    for pid in list(pool._processes):
        os.kill(pid, signal.SIGTERM)
        os.kill(pid, signal.SIGINT)
    time.sleep(0.5)
    assert math_reward._get_pool() is pool and all(p.is_alive() for p in pool._processes.values())
    assert grade(r"\boxed{5}", "5").correct
