"""reward.grading: the recipe's strict math_dapo exact match vs tirl's math-verify equivalence, on hand-made cases
from math_dapo's logic (last 100 characters, last `\\boxed{`, braces counted, exact string)."""

import pytest

from tirl.data.records import ProblemRow
from tirl.rewards.registry import get_verifier, graded_by
from tirl.rewards.scoring import Response, grade_responses
from tirl.rewards.shaping import RewardConfig
from tirl.rewards.strict import grade_math_dapo, strict_answer

CASES = [  # (response, ground truth, math-verify says, math_dapo says)
    ("so \\boxed{25}", "25", True, True),
    ("so \\boxed{025}", "25", True, False),  # a leading zero: equivalent, not the same string
    ("so \\boxed{ 25}", "25", True, False),  # no stripping
    ("so \\boxed{25.0}", "25", True, False),
    ("so \\boxed{\\frac{1}{2}}", "\\frac{1}{2}", True, True),  # nested braces counted
    ("so \\boxed{0.5}", "\\frac{1}{2}", True, False),
    (
        "\\boxed{25} and then" + " more words" * 10,
        "25",
        True,
        False,
    ),  # the box ends > 100 chars before the end
    ("so \\fbox{25}", "25", True, False),  # only \\boxed{ is a box
    ("so \\boxed{25}<|im_end|>", "25", True, True),  # special-token text is not part of the window
]


@pytest.mark.parametrize(("response", "truth", "lenient", "strict"), CASES)
def test_math_both_ways(response, truth, lenient, strict):
    assert get_verifier("math").fn(response, truth).correct is lenient
    assert grade_math_dapo(response, truth).correct is strict


@pytest.mark.parametrize(
    ("response", "lenient", "strict"),
    [("\\boxed{C}", True, True), ("\\boxed{(C)}", True, False), ("\\boxed{\\text{C}}", True, False),
     ("\\boxed{c}", True, False), ("\\boxed{C. 12 m/s}", True, False)],
)  # fmt: skip
def test_gpqa_letter_both_ways(response, lenient, strict):
    assert get_verifier("choice").fn(response, "C").correct is lenient
    assert grade_math_dapo(response, "C").correct is strict


def test_strict_answer_is_the_last_box_in_the_window():
    assert strict_answer("\\boxed{1} then \\boxed{2}") == "2"
    assert strict_answer("\\boxed{1") is None  # unclosed
    assert strict_answer("x" * 200) is None
    assert grade_math_dapo("no box", "1").details == {"no_boxed": True}
    assert grade_math_dapo(
        "\\boxed{1}", 1
    ).correct  # the ground truth is compared as str(), as the recipe stores it


def test_math_dapo_routes_everything_but_code_to_strict():
    for name in ("math", "integer", "gsm8k", "choice"):
        assert graded_by(name, "verify") == name
        assert graded_by(name, "math_dapo") == "math_dapo_strict"
    assert graded_by("code", "math_dapo") == "code"


def _response(text: str, source: str, truth: str) -> Response:
    return Response(text, ProblemRow("p", source, [], truth))


def test_scoring_follows_reward_grading():
    answers = [_response("\\boxed{025}", "aime24", "25"), _response("\\boxed{(B)}", "gpqa_diamond", "B")]
    lenient = grade_responses(answers, RewardConfig(workers=1))
    strict = grade_responses(answers, RewardConfig(workers=1, grading="math_dapo"))
    assert [g.correct for g in lenient] == [True, True]
    assert [g.correct for g in strict] == [False, False]
    assert [g.pred for g in strict] == ["025", "(B)"]  # the raw strings verl's maj@k votes on
