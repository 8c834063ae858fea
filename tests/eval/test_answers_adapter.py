"""Answers grouped by the verifier's equivalence (math-verify through tirl.rewards.math)."""

from tirl.eval.answers import canonical_answers, equivalent, extract_answer


def test_equivalent_answers_share_one_representative() -> None:
    got = canonical_answers(["0.5", "1/2", None, "\\frac{1}{2}", "3", "3.0", "x"])
    assert got == ["0.5", "0.5", None, "0.5", "3", "3", "x"]


def test_equivalence_uses_the_verifier() -> None:
    assert equivalent("\\frac{1}{2}", "\\dfrac{1}{2}")
    assert equivalent("25", "025")
    assert not equivalent("2", "3")
    assert extract_answer("so \\boxed{\\frac{1}{2}} done") == "\\frac{1}{2}"
    assert extract_answer("no answer") is None


def test_a_zero_denominator_is_not_a_crash() -> None:
    # "1/00" is a plain number to the fast path's pattern; Fraction("1/00") raised ZeroDivisionError
    got = canonical_answers(["1/2", "1/00", "1/0", "1/00"])
    assert got[0] == "1/2" and got[1] == got[3] and got[1] != "1/2"


def test_a_decimal_over_an_integer_goes_to_the_verifier() -> None:
    # Fraction("1.5/2") raised ValueError in the plain-number fast path
    assert canonical_answers(["0.75", "1.5/2", "3/04"]) == [
        "0.75",
        "0.75",
        "0.75",
    ]  # math-verify: 1.5/2 = 0.75
