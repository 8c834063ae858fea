"""Which verifier grades a row: one table keyed by `data_source`, a default per `ability`, then the recipe's rule.

A verifier is a name; the functions behind the names take (response, ground_truth) and return a GradeResult, and
are top-level so worker processes can run them (batch.py). Code grading needs a sandbox and is batched
separately (code.py). Lookup order: data_source (case-insensitive) in REGISTRY, then ability in BY_ABILITY, then
the recipe's routing: "code" in the data_source means code, anything else math.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tirl.data.benchmarks import gsm8k_answer, integer_answer
from tirl.rewards.choice import grade_choice
from tirl.rewards.math import GradeResult, grade

CODE = "code"


def grade_math(response: str, ground_truth: Any, *, timeout_s: float = 5.0) -> GradeResult:
    """Last \\boxed{} against the gold by math-verify (plain integers compared as integers)."""
    return grade(response, str(ground_truth), timeout_s=timeout_s)


def grade_integer(response: str, ground_truth: Any, *, timeout_s: float = 5.0) -> GradeResult:
    """AIME/AMC: the gold as a canonical integer ("025" and 25.0 are 25); the prediction as math-verify reads it."""
    return grade(response, integer_answer(ground_truth), timeout_s=timeout_s)


def grade_gsm8k(response: str, ground_truth: Any, *, timeout_s: float = 5.0) -> GradeResult:
    """GSM8K: a raw solution's gold is the number after '####'; an already extracted gold is used as is."""
    gold = str(ground_truth)
    return grade(response, gsm8k_answer(gold) if "####" in gold else gold, timeout_s=timeout_s)


def grade_letter(response: str, ground_truth: Any, *, timeout_s: float = 5.0) -> GradeResult:
    return grade_choice(response, str(ground_truth))


VERIFIERS: dict[str, Callable[..., GradeResult]] = {
    "math": grade_math,
    "integer": grade_integer,
    "gsm8k": grade_gsm8k,
    "choice": grade_letter,
}
KINDS = (*VERIFIERS, CODE)

REGISTRY: dict[str, str] = {
    "aime24": "integer",
    "aime25": "integer",
    "aime2024": "integer",
    "aime2025": "integer",
    "amc23": "integer",
    "math500": "math",
    "math_dapo": "math",
    "gsm8k": "gsm8k",
    "openai/gsm8k": "gsm8k",
    "gpqa": "choice",
    "gpqa_diamond": "choice",
    "humaneval": CODE,
    "livecodebench": CODE,
    "livecodebench_v6": CODE,
}
BY_ABILITY: dict[str, str] = {"math": "math", "code": CODE, "choice": "choice", "multiple_choice": "choice"}


def verifier_name(data_source: str, ability: str = "") -> str:
    source = (data_source or "").lower()
    if source in REGISTRY:
        return REGISTRY[source]
    if (ability or "").lower() in BY_ABILITY:
        return BY_ABILITY[ability.lower()]
    return CODE if "code" in source else "math"


def register(data_source: str, name: str) -> None:
    """Route a new data source to an existing verifier (a bad name raises and lists the valid ones)."""
    if name not in KINDS:
        raise ValueError(f"unknown verifier {name!r}; valid: {', '.join(KINDS)}")
    REGISTRY[data_source.lower()] = name
