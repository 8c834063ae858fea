"""pass@k and maj@k against brute-force enumeration of k-subsets."""

import math
from collections import Counter
from fractions import Fraction
from itertools import combinations

import pytest
from torch.testing import assert_close

from tirl.eval.metrics import (
    avg_at_n,
    default_ks,
    maj_at_k,
    pass_at_k,
    pass_at_k_curve,
    summarize,
    summarize_problem,
)


def brute_pass_at_k(n: int, c: int, k: int) -> float:
    """Share of k-subsets of n samples (the first c correct) holding at least one correct sample."""
    subsets = list(combinations(range(n), k))
    return sum(any(i < c for i in s) for s in subsets) / len(subsets)


def brute_maj_at_k(answers: list[str | None], correct: list[bool], k: int) -> float:
    """Mean over k-subsets of the expected correctness of the majority answer, random tie-break."""
    is_right = {
        a: max(ok for b, ok in zip(answers, correct, strict=True) if b == a) for a in answers if a is not None
    }
    total = 0.0
    subsets = list(combinations(range(len(answers)), k))
    for s in subsets:
        votes = Counter(answers[i] for i in s if answers[i] is not None)
        if votes:
            top = max(votes.values())
            tied = [a for a, v in votes.items() if v == top]
            total += sum(is_right[a] for a in tied) / len(tied)
    return total / len(subsets)


def test_pass_at_k_matches_brute_force() -> None:
    for n in range(1, 9):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert_close(pass_at_k(n, c, k), brute_pass_at_k(n, c, k), msg=f"n={n} c={c} k={k}")


def test_pass_at_k_known_values() -> None:
    assert_close(pass_at_k(10, 1, 1), 0.1)
    assert_close(pass_at_k(4, 1, 2), 0.5)  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert pass_at_k(5, 0, 3) == 0.0
    assert pass_at_k(5, 3, 3) == 1.0  # n - c = 2 < k


def test_pass_at_k_large_n_matches_exact_fraction() -> None:
    n, c, k = 1000, 3, 500
    value = pass_at_k(n, c, k)
    assert math.isfinite(value) and 0.0 <= value <= 1.0
    exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))  # = 1 - (500*499*498)/(1000*999*998)
    assert_close(value, float(exact))
    assert_close(value, 1 - (500 * 499 * 498) / (1000 * 999 * 998))


@pytest.mark.parametrize(("n", "c", "k"), [(3, 4, 1), (3, -1, 1), (3, 1, 0), (3, 1, 4)])
def test_pass_at_k_validation(n: int, c: int, k: int) -> None:
    with pytest.raises(ValueError, match=f"n={n}"):
        pass_at_k(n, c, k)


def test_avg_curve_and_default_ks() -> None:
    assert avg_at_n([True, False, False, True]) == 0.5
    with pytest.raises(ValueError):
        avg_at_n([])
    assert pass_at_k_curve(4, 1, [1, 2]) == {1: 0.25, 2: 0.5}
    assert default_ks(1) == [1]
    assert default_ks(8) == [1, 2, 4, 8]
    assert default_ks(12) == [1, 2, 4, 8, 12]


MAJ_CASES = [
    # (answers, correct, k, hand value)
    (["a", "a", "b"], [True, True, False], 1, 2 / 3),
    (["a", "a", "b"], [True, True, False], 2, (1 + 0.5 + 0.5) / 3),  # {a,b} subsets tie -> 1/2
    (["a", "a", "b"], [True, True, False], 3, 1.0),
    # subsets of 2: {a,N}=1, {a,N}=1, {a,b}=1/2, {N,N}=0, {N,b}=0, {N,b}=0 -> 2.5 / 6
    (["a", None, None, "b"], [True, False, False, False], 2, 2.5 / 6),
    (["a", None, None, "b"], [True, False, False, False], 1, 1 / 4),
    ([None, None], [False, False], 2, 0.0),
    # three-way tie of a, b, c with one correct: 1/3
    (["a", "b", "c"], [False, True, False], 3, 1 / 3),
    # b's flags inconsistent: any correct sample makes the answer correct; b beats a 2-1 -> 1
    (["b", "a", "b"], [False, False, True], 3, 1.0),
]


@pytest.mark.parametrize(("answers", "correct", "k", "expected"), MAJ_CASES)
def test_maj_at_k_exact_hand_and_brute_force(
    answers: list[str | None], correct: list[bool], k: int, expected: float
) -> None:
    value, stderr = maj_at_k(answers, correct, k)
    assert stderr == 0.0
    assert_close(value, expected)
    assert_close(value, brute_maj_at_k(answers, correct, k))


MC_ANSWERS = ["a", "a", "a", "b", "b", "c", None, "c", "b", None]
MC_CORRECT = [True, True, True, False, False, False, False, False, False, False]


def test_maj_at_k_exact_matches_brute_force_larger() -> None:
    for k in range(1, len(MC_ANSWERS) + 1):
        assert_close(maj_at_k(MC_ANSWERS, MC_CORRECT, k)[0], brute_maj_at_k(MC_ANSWERS, MC_CORRECT, k))


def test_maj_at_k_monte_carlo_within_four_standard_errors() -> None:
    exact, _ = maj_at_k(MC_ANSWERS, MC_CORRECT, 4)
    value, stderr = maj_at_k(MC_ANSWERS, MC_CORRECT, 4, exact_limit=1, num_samples=4000, seed=3)
    assert 0.0 < stderr < 0.02
    assert abs(value - exact) <= 4 * stderr
    assert maj_at_k(MC_ANSWERS, MC_CORRECT, 4, exact_limit=1, seed=3) == maj_at_k(
        MC_ANSWERS, MC_CORRECT, 4, exact_limit=1, seed=3
    )


def test_maj_at_k_validation() -> None:
    with pytest.raises(ValueError, match="length"):
        maj_at_k(["a"], [True, False], 1)
    with pytest.raises(ValueError, match="k=3"):
        maj_at_k(["a", "b"], [True, False], 3)


def test_summarize_problem_and_summarize() -> None:
    p1 = ([True, False, False, False], ["1", "2", "2", "3"])
    p2 = ([True] * 4, ["5"] * 4)
    one = summarize_problem(*p1, ks=[1, 2, 4])
    assert one == {
        "avg@n": 0.25,
        "pass@1": 0.25,
        "pass@2": 0.5,
        "pass@4": 1.0,
        "maj@1": 0.25,
        "maj@2": 1.5 / 6,  # "1" ties with "2" or "3" in 3 of 6 pairs: 3 * 1/2; the other pairs are wrong
        "maj@4": 0.0,  # "2" wins 2-1-1
    }
    out = summarize({"p1": p1, "p2": p2})  # default ks for n = 4: 1, 2, 4
    ks = [1, 2, 4]
    metric_keys = {"avg@n"} | {f"pass@{k}" for k in ks} | {f"maj@{k}" for k in ks}
    assert set(out) == metric_keys | {"num_problems", "samples_per_problem"}
    assert_close(out["avg@n"], 0.625)
    assert_close(out["pass@2"], 0.75)
    assert_close(out["maj@4"], 0.5)
    assert out["num_problems"] == 2.0 and out["samples_per_problem"] == 4.0


def test_summarize_validation() -> None:
    with pytest.raises(ValueError, match="'short'"):
        summarize({"ok": ([True, False], ["a", "b"]), "short": ([True], ["a"])})
    with pytest.raises(ValueError):
        summarize({})
