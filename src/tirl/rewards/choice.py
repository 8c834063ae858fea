"""Multiple choice (GPQA): the letter in the last `\\boxed{}` against the gold letter, +1 / -1.

Accepts the forms models write around a letter (`C`, `(C)`, `C)`, `\\text{C}`, `C. option text`); anything else
in the box is wrong, never guessed at. Not here: free-text answers (math.py).
"""

from __future__ import annotations

import re

from tirl.rewards.math import GradeResult, last_boxed

_LETTER_RE = re.compile(r"^\(?([A-Za-z])\)?(?:[.:)]\s.*)?$", re.DOTALL)
_TEXT_RE = re.compile(r"^\\(?:text|textbf|mathrm|mathbf)\{(.*)\}$", re.DOTALL)


def boxed_letter(text: str) -> str | None:
    """The single option letter in the last box, upper-cased; None if the box holds something else."""
    inner = last_boxed(text)
    if inner is None:
        return None
    inner = inner.strip()
    while m := _TEXT_RE.match(inner):
        inner = m.group(1).strip()
    m = _LETTER_RE.match(inner)
    return m.group(1).upper() if m else None


def grade_choice(response: str, ground_truth: str) -> GradeResult:
    gold = str(ground_truth).strip().upper()
    if len(gold) != 1 or not gold.isalpha():
        raise ValueError(f"multiple-choice ground truth must be one letter, got {ground_truth!r}")
    box = last_boxed(response)
    if box is None:
        return GradeResult(-1.0, False, None, {"no_boxed": True})
    pred = boxed_letter(response)
    if pred is None:
        return GradeResult(-1.0, False, box, {"not_a_letter": True})
    return GradeResult(1.0 if pred == gold else -1.0, pred == gold, pred)
