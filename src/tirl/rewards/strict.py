"""The recipe's strict grading (verl's `math_dapo.compute_score(strict_box_verify=True)`), for `reward.grading=math_dapo`.

What it does, from the source's behaviour: keep the last 300 characters of the response, then the last 100 of
those; find the last `\\boxed{` there and its closing brace by counting braces (a backslash escapes nothing); the
answer is correct iff the box's content is exactly the ground-truth string: no stripping, no normalization, no
equivalence. So `\\boxed{025}` against "25", `\\boxed{ 25}` and `\\boxed{25.}` are wrong, `\\fbox{}` and
`\\boxed {}` are not boxes, and a box that ends more than 100 characters before the end is not seen. GPQA is
graded the same way: the box must hold exactly the letter.

The recipe grades the decoded response without special tokens; tirl passes the model's own turns (tool output is
never graded), so special-token text (`<|im_end|>`) is removed here before the window is taken.
"""

from __future__ import annotations

import re
from typing import Any

from tirl.rewards.math import GradeResult

WINDOW = 100  # characters of the response's end the box must lie in
_BOX = "\\boxed{"
_SPECIAL_RE = re.compile(r"<\|[A-Za-z0-9_]+\|>")


def strict_last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` in `text`, braces counted without escapes; None if absent or unclosed."""
    start = text.rfind(_BOX)
    if start < 0:
        return None
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start + len(_BOX) : i]
    return None


def strict_answer(response: str) -> str | None:
    """The answer the strict grader reads: the last box within the last `WINDOW` characters."""
    return strict_last_boxed(_SPECIAL_RE.sub("", response)[-WINDOW:])


def grade_math_dapo(response: str, ground_truth: Any, *, timeout_s: float = 5.0) -> GradeResult:
    """+1 iff the strict answer equals str(ground_truth) exactly, else -1 (timeout_s: unused, nothing is slow)."""
    pred = strict_answer(response)
    if pred is None:
        return GradeResult(-1.0, False, None, {"no_boxed": True})
    correct = pred == str(ground_truth)
    return GradeResult(1.0 if correct else -1.0, correct, pred)


__all__ = ["WINDOW", "grade_math_dapo", "strict_answer", "strict_last_boxed"]
