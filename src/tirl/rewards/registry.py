"""Which verifier grades a row, and what each verifier is: one registry, open to verifiers defined outside tirl.

A `Verifier` is a grading function plus the properties the rest of tirl asks about, so no caller branches on a
verifier's name:
  - `needs_sandbox`: `fn(responses, ground_truths, *, sandbox, timeout_s) -> list[GradeResult]`, graded in one
    sandbox batch (code tests); otherwise `fn(response, ground_truth, *, timeout_s) -> GradeResult`, one item;
  - `timeout_s`: the per-item time limit (None: the run's `reward.timeout_s`, or `code_timeout_s` with a sandbox);
  - `in_workers`: graded in the spawned worker processes with a hard per-item timeout (the function must be
    importable by name); otherwise in a thread of the trainer, where a late item is reported as a timeout;
  - `is_fast(response, ground_truth)`: decided in microseconds, graded inline even when `in_workers` (math's
    plain integers, a missing box);
  - `extract(response)` and `equivalent(a, b)`: the answer maj@k votes on, and when two answers are the same
    vote (`tirl eval` summaries and `tirl analyze`).

Routing, in order: `data_source` (case-insensitive) in the source table, then `ability`, then the recipe's rule
("code" in the data_source means code, anything else math). `register_verifier(name, fn, ...)` adds a verifier and
`route(data_source, name)` sends a data source to it; both work from any module, before a run starts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tirl.data.benchmarks import integer_answer
from tirl.rewards.choice import boxed_letter, grade_choice
from tirl.rewards.math import GradeResult, as_int, grade, last_boxed, math_equivalent
from tirl.rewards.strict import grade_math_dapo, strict_answer

CODE = "code"
STRICT = "math_dapo_strict"  # the recipe's exact match (reward.grading=math_dapo): every verifier without a sandbox


def grade_math(response: str, ground_truth: Any, *, timeout_s: float = 5.0) -> GradeResult:
    """Last \\boxed{} against the gold by math-verify (plain integers compared as integers)."""
    return grade(response, str(ground_truth), timeout_s=timeout_s)


def grade_integer(response: str, ground_truth: Any, *, timeout_s: float = 5.0) -> GradeResult:
    """AIME/AMC: the gold as a canonical integer ("025" and 25.0 are 25); the prediction as math-verify reads it."""
    return grade(response, integer_answer(ground_truth), timeout_s=timeout_s)


def grade_letter(response: str, ground_truth: Any, *, timeout_s: float = 5.0) -> GradeResult:
    return grade_choice(response, str(ground_truth))


def math_is_fast(response: str, ground_truth: Any) -> bool:
    """No box, or two plain integers: decided without sympy."""
    pred = last_boxed(response)
    return pred is None or (as_int(pred) is not None and as_int(str(ground_truth)) is not None)


def _always(response: str, ground_truth: Any) -> bool:
    return True


def _same(a: str, b: str) -> bool:
    return a.strip() == b.strip()


def _code_batch(*args: Any, **kwargs: Any) -> list[GradeResult]:
    from tirl.rewards.code import (
        grade_code_batch,  # code.py imports the sandbox types; keep this module light
    )

    return grade_code_batch(*args, **kwargs)


@dataclass(frozen=True)
class Verifier:
    """A grading function and how to run it (see the module docstring for each property)."""

    name: str
    fn: Callable[..., Any]
    needs_sandbox: bool = False
    timeout_s: float | None = None
    in_workers: bool = False
    is_fast: Callable[[str, Any], bool] | None = None
    extract: Callable[[str], str | None] = last_boxed
    equivalent: Callable[[str, str], bool] = _same


_VERIFIERS: dict[str, Verifier] = {}
_SOURCES: dict[str, str] = {}
BY_ABILITY: dict[str, str] = {"math": "math", "code": CODE, "choice": "choice", "multiple_choice": "choice"}


def register_verifier(
    name: str,
    fn: Callable[..., Any],
    *,
    needs_sandbox: bool = False,
    timeout_s: float | None = None,
    in_workers: bool = False,
    is_fast: Callable[[str, Any], bool] | None = None,
    extract: Callable[[str], str | None] = last_boxed,
    equivalent: Callable[[str, str], bool] = _same,
    data_sources: tuple[str, ...] = (),
    abilities: tuple[str, ...] = (),
    replace: bool = False,
) -> Verifier:
    """Add a verifier under `name` and route `data_sources` / `abilities` to it; returns it.

    Registering a taken name raises unless `replace=True` (two packages must not silently fight over one name).
    """
    if not name or not callable(fn):
        raise ValueError(f"register_verifier needs a name and a callable, got {name!r}, {fn!r}")
    if name in _VERIFIERS and not replace:
        raise ValueError(f"verifier {name!r} is already registered (pass replace=True to override it)")
    if timeout_s is not None and timeout_s <= 0:
        raise ValueError(f"verifier {name!r}: timeout_s must be > 0, got {timeout_s}")
    v = Verifier(name, fn, needs_sandbox, timeout_s, in_workers, is_fast, extract, equivalent)
    _VERIFIERS[name] = v
    for source in data_sources:
        route(source, name, by=f"verifier {name!r}", replace=replace)
    for ability in abilities:
        BY_ABILITY[ability.lower()] = name
    return v


def get_verifier(name: str) -> Verifier:
    """The verifier registered as `name`; a bad name raises and lists the valid ones."""
    if name not in _VERIFIERS:
        raise ValueError(
            f"unknown verifier {name!r}; valid: {', '.join(sorted(_VERIFIERS))} (a dataset's own verifier, such as "
            "gsm8k's, is registered by its task: import tirl.tasks)"
        )
    return _VERIFIERS[name]


def verifier_names() -> list[str]:
    return sorted(_VERIFIERS)


def route(data_source: str, name: str, *, by: str = "", replace: bool = False) -> None:
    """Send rows of `data_source` to verifier `name` (a bad name raises and lists the valid ones). A source already
    sent to another verifier raises unless `replace=True` (`by` names who asks, for that error)."""
    get_verifier(name)
    key = data_source.lower()
    taken = _SOURCES.get(key)
    if taken is not None and taken != name and not replace:
        raise ValueError(
            f"data source {data_source!r} is graded by verifier {taken!r}; {by or 'route'} sends it to {name!r} "
            "(pass replace=True to override)"
        )
    _SOURCES[key] = name


def verifier_name(data_source: str, ability: str = "") -> str:
    source = (data_source or "").lower()
    if source in _SOURCES:
        return _SOURCES[source]
    if (ability or "").lower() in BY_ABILITY:
        return BY_ABILITY[ability.lower()]
    return CODE if "code" in source else "math"


def graded_by(name: str, grading: str) -> str:
    """The verifier that grades under `reward.grading`: the routed one, or under math_dapo the strict exact match
    for everything the recipe sends to math_dapo (all but the sandboxed code tests)."""
    if grading == "math_dapo" and not get_verifier(name).needs_sandbox:
        return STRICT
    return name


def verifier_for(data_source: str, ability: str = "") -> Verifier:
    return get_verifier(verifier_name(data_source, ability))


register = route  # the earlier name of `route`

# The built-in routes: the data sources of the benchmarks (each benchmark's task, tirl.tasks.benchmarks, declares
# the same tuple, so its rows are graded alike with or without tirl.tasks loaded) and of the recipe's data.
MATH_SOURCES = ("math500", "math_dapo")
INTEGER_SOURCES = ("aime24", "aime25", "aime2024", "aime2025", "amc23")
CHOICE_SOURCES = ("gpqa", "gpqa_diamond")
CODE_SOURCES = ("humaneval", "livecodebench", "livecodebench_v6")

_MATH = {"in_workers": True, "is_fast": math_is_fast, "equivalent": math_equivalent}
register_verifier("math", grade_math, **_MATH, data_sources=MATH_SOURCES)
register_verifier("integer", grade_integer, **_MATH, data_sources=INTEGER_SOURCES)
register_verifier("choice", grade_letter, is_fast=_always, extract=boxed_letter, data_sources=CHOICE_SOURCES)
register_verifier(STRICT, grade_math_dapo, is_fast=_always, extract=strict_answer)
register_verifier(CODE, _code_batch, needs_sandbox=True, data_sources=CODE_SOURCES)
