"""The one adapter between the analysis and the verifier: answer extraction and answer equivalence.

Everything the analysis needs from `tirl.rewards.math` goes through this module, so a change there (new answer
formats, another verifier) touches one file here. Equivalence is the verifier's: two answers are the same when
grading one against the other as ground truth says correct (math-verify, integers fast-pathed).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from fractions import Fraction

from tirl.rewards.math import grade, last_boxed

# what Fraction() reads: an integer or decimal, or integer/integer with a nonzero denominator ("1.5/2", "1/00" no)
_PLAIN_NUMBER = re.compile(r"[-+]?(\d+(\.\d+)?|\d+/0*[1-9]\d*)")


def extract_answer(text: str) -> str | None:
    """The final answer a response commits to (its last \\boxed{}), as the grader sees it."""
    return last_boxed(text)


@functools.lru_cache(maxsize=65536)
def equivalent(a: str, b: str) -> bool:
    """True if answer `b` grades correct against `a` as ground truth (cached: one problem's answers repeat)."""
    if a == b:
        return True
    if _PLAIN_NUMBER.fullmatch(a) and _PLAIN_NUMBER.fullmatch(b):
        return Fraction(a) == Fraction(b)  # fast path for plain numbers, where math-verify agrees
    return grade(f"\\boxed{{{b}}}", a, timeout_s=2.0).correct


def canonical_answers(answers: Sequence[str | None]) -> list[str | None]:
    """Each answer replaced by the first-seen member of its equivalence class (None stays None).

    Classes are built greedily in order of first appearance: an answer joins the first representative it is
    equivalent to. For a transitive verifier this is exactly the partition into equivalence classes.
    """
    reps: list[str] = []
    mapping: dict[str, str] = {}
    out: list[str | None] = []
    for a in answers:
        if a is None:
            out.append(None)
            continue
        key = a.strip()
        if key not in mapping:
            mapping[key] = next((r for r in reps if equivalent(r, key)), key)
            if mapping[key] == key:
                reps.append(key)
        out.append(mapping[key])
    return out
