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
