"""GSM8K's verifier: the gold number after "####", the answer the last \\boxed{} or, without one, GSM8K's own
"#### N" answer line (the few-shot format, `fewshot.py`)."""

from __future__ import annotations

import re
from typing import Any

from tirl.rewards.math import GradeResult, grade, last_boxed, math_equivalent
from tirl.rewards.registry import math_is_fast, register_verifier
from tirl.tasks.gsm8k.data import gsm8k_answer

VERIFIER = "gsm8k"
_ANSWER_LINE = re.compile(r"#### (\-?[0-9\.\,]+)")  # lighteval's gsm8k_normalizer


def answer_line(response: str) -> str | None:
    """The number on GSM8K's own answer line as lighteval's GSM8K metric reads it (`gsm8k_normalizer`, from
    OpenAI's grade-school-math): the text before the first "Question" (the task's stop sequence), its first
    "#### N", commas removed; None if there is none."""
    found = _ANSWER_LINE.search(response.split("Question", 1)[0])
    return found.group(1).strip().replace(",", "") if found else None


def gsm8k_pred(response: str) -> str | None:
    """The answer the gsm8k verifier reads: the last \\boxed{}, else the "#### N" answer line."""
    boxed = last_boxed(response)
    return boxed if boxed is not None else answer_line(response)


def grade_gsm8k(response: str, ground_truth: Any, *, timeout_s: float = 5.0) -> GradeResult:
    """GSM8K's verifier: a raw solution's gold is the number after '####' (`gsm8k_answer`, which
    `tirl data prepare gsm8k` applies); an already extracted gold is used as is.

    The answer is the last \\boxed{} (math-verify equivalence, plain integers as integers); a response with no box
    is read at its "#### N" line (`answer_line`: the few-shot prompt's format, `fewshot.py`) and is correct
    when that number is the gold exactly, as lighteval compares them ("72.0" against "72" is wrong)."""
    gold = str(ground_truth)
    gold = gsm8k_answer(gold) if "####" in gold else gold
    line = answer_line(response) if last_boxed(response) is None else None
    if line is not None:
        correct = line == gold.strip()
        return GradeResult(1.0 if correct else -1.0, correct, line)
    return grade(response, gold, timeout_s=timeout_s)


register_verifier(
    VERIFIER,
    grade_gsm8k,
    in_workers=True,
    is_fast=math_is_fast,
    extract=gsm8k_pred,
    equivalent=math_equivalent,
)
