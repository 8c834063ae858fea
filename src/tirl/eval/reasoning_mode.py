"""The reasoning-mode question of `tirl analyze`: do fewer, deliberate tool calls go with higher accuracy?

From one model's sample records (`records.jsonl`: correct, num_tool_calls, problem and temperature), three numbers:

- accuracy by the number of tool calls of the answer (0, 1, 2, 3+), each with a bootstrap interval over problems
  (problems are drawn, not samples: the samples of one problem are not independent);
- the within-problem relation: on the problems a model answers right sometimes and wrong sometimes, the mean
  calls of its correct answers minus those of its wrong ones, paired per problem so that problem difficulty
  cancels, with a bootstrap interval over those problems (`tirl.eval.bootstrap`);
- one line, the verdict, that says which way it goes, or why it cannot be tested here.

The verdict reads the answers that call the tool (>= 1 call): the paper's claim sets a few deliberate calls against
frequent ones, and an answer without a call is another mode (guessing), whose accuracy the buckets show apart.
Where every such answer makes the same number of calls (a task that takes exactly one call), fewer against more
calls cannot be tested, and the verdict says so. The within-problem numbers over all answers, 0 calls included,
are in the report too (`within_problem_all`). A problem is one (data source, problem, temperature): samples of
different temperatures are never paired.

Pure numpy over records; no I/O.
"""

from __future__ import annotations

import warnings
from collections import defaultdict
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from tirl.eval.bootstrap import paired_difference, resample_weights

BUCKETS = ("0", "1", "2", "3+")  # tool calls per answer


class _Record(Protocol):  # what is read of a SampleRecord (`tirl.eval.evaluate`)
    data_source: str
    problem_id: str
    temperature: float | None
    correct: bool
    num_tool_calls: int


def bucket(calls: int) -> int:
    """The index in BUCKETS of an answer with `calls` tool calls."""
    return min(calls, len(BUCKETS) - 1)


def _problems(records: Sequence[_Record]) -> list[list[tuple[int, bool]]]:
    """(calls, correct) of each sample, grouped by problem (data source, problem id, temperature)."""
    groups: dict[tuple, list[tuple[int, bool]]] = defaultdict(list)
    for r in records:
        groups[(r.data_source, r.problem_id, r.temperature)].append((int(r.num_tool_calls), bool(r.correct)))
    return [groups[k] for k in sorted(groups, key=str)]


def _quantiles(reps: np.ndarray, level: float) -> tuple[np.ndarray, np.ndarray]:
    alpha = (1.0 - level) / 2
    with warnings.catch_warnings():  # a bucket no answer fell in is all nan, and reported as None
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanquantile(reps, alpha, axis=0), np.nanquantile(reps, 1.0 - alpha, axis=0)


def accuracy_by_calls(
    problems: list[list[tuple[int, bool]]], *, num_resamples: int, seed: int, level: float
) -> dict[str, dict[str, float | int | None]]:
    """Per bucket: samples, problems, accuracy (correct / samples in the bucket) and its interval over problems."""
    total = np.zeros((len(problems), len(BUCKETS)))
    right = np.zeros_like(total)
    for i, samples in enumerate(problems):
        for calls, ok in samples:
            total[i, bucket(calls)] += 1
            right[i, bucket(calls)] += ok
    weights = resample_weights(len(problems), num_resamples, seed)  # (B, P)
    with np.errstate(invalid="ignore", divide="ignore"):
        reps = (weights @ right) / (weights @ total)  # (B, K); nan where a replicate has no such answer
        lo, hi = _quantiles(reps, level)
    out: dict[str, dict[str, float | int | None]] = {}
    for j, name in enumerate(BUCKETS):
        n = int(total[:, j].sum())
        acc = float(right[:, j].sum() / n) if n else None
        out[name] = {
            "samples": n,
            "problems": int((total[:, j] > 0).sum()),
            "accuracy": acc,
            "lo": float(lo[j]) if n else None,
            "hi": float(hi[j]) if n else None,
        }
    return out


def within_problem(
    problems: list[list[tuple[int, bool]]], *, num_resamples: int, seed: int, level: float
) -> dict[str, Any]:
    """On the problems with both a correct and a wrong answer: mean calls of the correct answers minus those of
    the wrong ones, per problem, its mean with a paired interval over problems, and how many problems go each way."""
    correct, wrong = [], []
    for samples in problems:
        ok = [c for c, good in samples if good]
        bad = [c for c, good in samples if not good]
        if ok and bad:
            correct.append(np.mean(ok))
            wrong.append(np.mean(bad))
    out: dict[str, Any] = {"problems": len(correct)}
    if not correct:
        return out
    a, b = np.array(wrong)[:, None], np.array(correct)[:, None]
    ci, _, _ = paired_difference(a, b, resample_weights(len(correct), num_resamples, seed), level=level)
    diff = b[:, 0] - a[:, 0]
    return {
        **out,
        "calls_correct": float(b.mean()),
        "calls_wrong": float(a.mean()),
        "difference": float(ci.mean[0]),  # correct - wrong: < 0 means correct answers made fewer calls
        "lo": float(ci.lo[0]),
        "hi": float(ci.hi[0]),
        "fewer_when_correct": int((diff < 0).sum()),
        "more_when_correct": int((diff > 0).sum()),
        "same": int((diff == 0).sum()),
    }


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def verdict(by_calls: dict[str, dict], within: dict[str, Any], calls_seen: set[int], level: float) -> str:
    """One line: which way calls and accuracy go among tool-using answers, or why that cannot be tested."""
    buckets = ", ".join(
        f"{name}: {_pct(b['accuracy'])} of {b['samples']}" for name, b in by_calls.items() if b["samples"]
    )
    head = f"accuracy by tool calls ({buckets})"
    using = sorted(c for c in calls_seen if c > 0)
    if not using:
        return f"{head}; cannot be tested: no answer calls the tool"
    if len(using) == 1:
        k = using[0]
        return (
            f"{head}; cannot be tested: every answer that calls the tool makes exactly {k} call{'s' * (k > 1)} "
            f"(the task takes {'one call' if k == 1 else f'{k} calls'}), so fewer against more calls does not arise"
        )
    if not any(b["accuracy"] for b in by_calls.values() if b["samples"]):
        return f"{head}; cannot be tested: no answer is correct"
    if not within["problems"]:
        return (
            f"{head}; cannot be tested within problems: no problem has both a correct and a wrong answer that "
            "calls the tool"
        )
    d, lo, hi, p = within["difference"], within["lo"], within["hi"], within["problems"]
    said = (
        f"on {p} problem{'s' * (p > 1)} answered right and wrong, correct answers made {d:+.2f} calls against wrong ones, "
        f"{100 * level:.0f}% interval [{lo:+.2f}, {hi:+.2f}]"
    )
    if hi < 0:
        return f"{head}; fewer calls go with correct answers: {said}"
    if lo > 0:
        return f"{head}; more calls go with correct answers: {said}"
    return f"{head}; no relation shown (the interval holds 0): {said}"


def reasoning_mode(
    records: Sequence[_Record], *, num_resamples: int = 1000, seed: int = 0, level: float = 0.95
) -> dict[str, Any]:
    """One model's report section: `by_calls`, `within_problem` (answers with >= 1 call), `within_problem_all`
    (every answer), `calls` (how many answers made each number of calls) and `verdict`."""
    if not records:
        return {"samples": 0, "verdict": "no samples"}
    kw = {"num_resamples": num_resamples, "seed": seed, "level": level}
    problems = _problems(records)
    using = [[s for s in samples if s[0] > 0] for samples in problems]
    by_calls = accuracy_by_calls(problems, **kw)
    within = within_problem(using, **kw)
    seen: dict[int, int] = defaultdict(int)
    for r in records:
        seen[int(r.num_tool_calls)] += 1
    return {
        "samples": len(records),
        "problems": len(problems),
        "calls": {str(k): seen[k] for k in sorted(seen)},
        "by_calls": by_calls,
        "within_problem": within,
        "within_problem_all": within_problem(problems, **kw),
        "verdict": verdict(by_calls, within, set(seen), level),
    }
