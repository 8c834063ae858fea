"""The lucky-guess audit on hand-written reasoning: planted false statements are found, true ones pass."""

from fractions import Fraction

import pytest

from tirl.eval.audit import UnsafeExpression, answer_source, find_statements, safe_eval

REASONING = r"""
First add the four numbers: 195 + 367 + 562 + 900 = 2024, so the total is 2024.
The product is $12 \times 34 = 418$ (planted: 408).
A power: 2^{10} = 1024, and 3^4 = 81.
A fraction: \frac{3}{4} = 0.75, and 1/3 = 0.333.
Chain with a slip: (7 + 5) * 3 = 36 = 38.
Negative: 7 - 10 = -3. Thousands: 1,000 + 24 = 1,024.
Not statements: x + 3 = 7, f(2) = 5, 2x = 6, 50% = 0.5, 954 * 968 mod 97 = 5, step 3 = done.
<tool_call>{"name": "code_interpreter", "arguments": {"code": "print(2 + 2 == 5)"}}</tool_call>
"""


def test_planted_false_statements_are_found_and_true_ones_pass() -> None:
    found = {s.text: s.true for s in find_statements(REASONING)}
    assert found == {
        "195 + 367 + 562 + 900 = 2024": True,
        "12 * 34 = 418": False,
        "2**(10) = 1024": True,
        "3**4 = 81": True,
        "((3)/(4)) = 0.75": True,
        "1/3 = 0.333": True,  # a decimal stands for what rounds to it
        "(7 + 5) * 3 = 36 = 38": False,  # a chain is false if any link is
        "7 - 10 = -3": True,
        "1000 + 24 = 1024": True,
    }


def test_values_are_exact() -> None:
    (s,) = find_statements("so 1/3 + 1/6 = 0.6")
    assert s.values == (Fraction(1, 2), Fraction(3, 5)) and not s.true
    (s,) = find_statements("then 0.1 + 0.2 = 0.3 exactly")
    assert s.true  # exact rationals, no float rounding


@pytest.mark.parametrize(
    "expr",
    [
        "__import__('os')",
        "9**9**9",
        "10**100000",
        "1/0",
        "(1).__class__",
        "a + 1",
        "2 ** 0.5",
        "'1' + '2'",
        "1" * 300,
    ],
)
def test_safe_eval_refuses_anything_but_bounded_arithmetic(expr: str) -> None:
    with pytest.raises(UnsafeExpression):
        safe_eval(expr)


def test_safe_eval_values() -> None:
    assert safe_eval("2 ** -2") == Fraction(1, 4)
    assert safe_eval("-(3 - 5) * 1.5") == Fraction(3)


def test_answer_source() -> None:
    assert answer_source("16711", ["16711\n"]) == "tool"
    assert answer_source("16,711", ["the result is 16711"]) == "tool"
    assert answer_source("1/2", ["0.5\n"]) == "tool"  # equal values count, not equal strings
    assert answer_source("16711", ["167110\n"]) == "text"
    assert answer_source("16711", []) == "text"
    assert answer_source("x^2 + 1", ["1"]) == "n/a"
    assert answer_source(None, ["1"]) == "n/a"


def test_statements_inside_parentheses() -> None:
    assert [s.text for s in find_statements("(so 3 + 4 = 7) and (2 * 3 = 6).")] == ["3 + 4 = 7", "2 * 3 = 6"]
    assert [s.true for s in find_statements("we get 5 * 5 = 24 (oops)")] == [False]


def test_latex_math_delimiters() -> None:
    got = [
        (s.text, s.true)
        for s in find_statements(r"\[12 \times 34 = 418\] and \(2^{10}=1024\), 5\sqrt{2} = 7")
    ]
    assert got == [("12 * 34 = 418", False), ("2**(10) = 1024", True)]


def test_long_decimals_are_read_exactly_not_as_floats() -> None:
    # a float literal keeps ~16 digits: 0.333...3 (20 digits) would read as 0.3333333333333333 and be "false"
    (s,) = find_statements("so 1/3 = 0.33333333333333333333")
    assert s.values[1] == Fraction(33333333333333333333, 10**20) and s.true
    (s,) = find_statements("and 0.10000000000000000001 * 10 = 1")
    assert not s.true  # exactly 1.0000000000000000001, not 1


@pytest.mark.parametrize("answer", ["1e400", "1e-999", "1e999999999"])
def test_answer_value_with_a_huge_exponent_is_refused_not_crashed_or_computed(answer: str) -> None:
    with pytest.raises(UnsafeExpression):
        safe_eval(answer)
    assert answer_source(answer, ["1"]) == "n/a"


def test_adversarial_runs_of_parentheses_cost_linear_time() -> None:
    import time

    # unwrapping recounted the side per dropped "(": 200k of them took ~15 s; linear takes ~0.03 s
    t = time.perf_counter()
    found = find_statements("(" * 200_000 + "1 + 1 = 2") + find_statements("1 + 1 = 3" + ")" * 200_000)
    assert time.perf_counter() - t < 3.0
    assert [(s.text, s.true) for s in found] == [("1 + 1 = 2", True), ("1 + 1 = 3", False)]
