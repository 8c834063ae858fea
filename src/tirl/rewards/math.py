"""Grade a math response: the last `\\boxed{}` answer against the ground truth, +1 if equivalent, else -1.

Equivalence is math-verify's (sympy-based), behind a fast path for plain integers. math-verify bounds its own
time with SIGALRM, which only works on the main thread; graded from any other thread (a rollout worker), the
check runs in a single spawned worker process instead, abandoned and killed when it exceeds the timeout. That
timeout also counts time queued behind other threads' checks (each takes milliseconds). As with any spawn
worker, the launching script must guard its entry point with `if __name__ == "__main__":`.

Not here: answer formats other than `\\boxed{}` / `\\fbox{}`, partial credit, reward shaping (see shaping.py).
"""

from __future__ import annotations

import concurrent.futures
import functools
import logging
import math
import multiprocessing
import re
import threading
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from math_verify import parse, verify
from math_verify.errors import TimeoutException

_BOXED_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
# what Fraction() reads: an integer or decimal, or integer/integer with a nonzero denominator ("1.5/2", "1/00" no)
_PLAIN_NUMBER = re.compile(r"[-+]?(\d+(\.\d+)?|\d+/0*[1-9]\d*)")
_INT_RE = re.compile(r"[+-]?(\d+|\d{1,3}(,\d{3})+)")
_POOL_STARTUP_TIMEOUT_S = 120.0  # importing sympy in a fresh process is slow; not charged to any one grade

_pool: ProcessPoolExecutor | None = None
_pool_lock = threading.Lock()


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` / `\\fbox{...}`, braces matched; None if absent or unclosed."""
    matches = list(_BOXED_RE.finditer(text))
    if not matches:
        return None
    start = matches[-1].end()
    depth, i = 1, start
    while i < len(text):
        ch = text[i]
        if ch == "\\":  # `\{`, `\}` and `\\` are literal, not grouping
            i += 2
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[start:i].strip()
        i += 1
    return None


@dataclass(frozen=True)
class GradeResult:
    """score is +1 / -1; details say why a -1 is not a plain mismatch ({"timeout": True}, {"error": ...})."""

    score: float
    correct: bool
    pred: str | None
    details: dict[str, Any] = field(default_factory=dict)


def as_int(text: str) -> int | None:
    """The integer a plain integer answer spells ("025", "1,000"); None for anything else."""
    text = text.strip()
    if not _INT_RE.fullmatch(text):
        return None
    return int(text.replace(",", ""))


def _verify_texts(gold_text: str, pred_text: str, timeout_s: int | None) -> tuple[bool, str | None]:
    """(equivalent, error); runs in the caller (main thread) or in the worker process (timeout_s=None)."""
    try:
        gold = parse(gold_text, parsing_timeout=timeout_s, raise_on_error=True)
        pred = parse(pred_text, parsing_timeout=timeout_s, raise_on_error=True)
        return bool(verify(gold, pred, timeout_seconds=timeout_s, raise_on_error=True)), None
    except Exception as e:
        return False, repr(e)


def _warm_up() -> bool:
    """First task of a new worker: pay the sympy import once, and silence math-verify's warning that its own
    timeouts are off (in the worker they are replaced by the parent's `future.result(timeout)`)."""
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    parse("$1$")
    return True


def ignore_stop_signals() -> None:
    """A grading worker's initializer: SIGINT and SIGTERM are for its parent, which decides when the pool ends.
    A terminal's Ctrl-C and torchrun's SIGTERM reach the whole process group, and a worker that died of them would
    fail the step the trainer is finishing before it checkpoints; SIGKILL still ends a stuck worker."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _get_pool() -> ProcessPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            pool = ProcessPoolExecutor(
                max_workers=1,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=ignore_stop_signals,
            )
            pool.submit(_warm_up).result(timeout=_POOL_STARTUP_TIMEOUT_S)
            _pool = pool
        return _pool


def _recycle_pool(pool: ProcessPoolExecutor) -> None:
    """Kill the worker (it may be stuck in sympy) and let the next call start a fresh one."""
    global _pool
    with _pool_lock:
        if _pool is pool:
            _pool = None
    for proc in list((getattr(pool, "_processes", None) or {}).values()):
        proc.kill()
    pool.shutdown(wait=False, cancel_futures=True)


def _call_with_timeout(fn: Callable[..., Any], args: tuple, timeout_s: float) -> Any:
    """fn(*args) in the worker process; TimeoutError (after killing the worker) if it takes too long."""
    for _ in range(2):
        pool = _get_pool()
        future = pool.submit(fn, *args)
        try:
            return future.result(timeout=timeout_s)
        except concurrent.futures.TimeoutError:
            _recycle_pool(pool)
            raise TimeoutError(f"{getattr(fn, '__name__', fn)} took longer than {timeout_s} s") from None
        except (BrokenProcessPool, concurrent.futures.CancelledError):
            _recycle_pool(
                pool
            )  # another caller's timeout killed the worker under us: retry once on a new one
    raise RuntimeError("math-verify worker process failed twice")


def grade(response: str, ground_truth: str, *, timeout_s: float = 5.0) -> GradeResult:
    """+1 if the last boxed answer in `response` equals `ground_truth` (math-verify equivalence), else -1."""
    pred = last_boxed(response)
    if pred is None:
        return GradeResult(-1.0, False, None, {"no_boxed": True})
    shown = pred
    # an escaped dollar is a currency sign (MATH's "\\$18.90"), not a math delimiter
    ground_truth, pred = ground_truth.replace("\\$", "").strip(), pred.replace("\\$", "").strip()
    gold_int, pred_int = as_int(ground_truth), as_int(pred)
    if gold_int is not None and pred_int is not None:  # AIME-style: "025" == "25", no sympy needed
        correct = gold_int == pred_int
        return GradeResult(1.0 if correct else -1.0, correct, shown)

    gold_text = ground_truth if ("$" in ground_truth or "\\boxed" in ground_truth) else f"${ground_truth}$"
    pred_text = f"$\\boxed{{{pred}}}$"
    details: dict[str, Any] = {}
    if threading.current_thread() is threading.main_thread():
        try:
            correct, error = _verify_texts(
                gold_text, pred_text, max(1, math.ceil(timeout_s))
            )  # alarm(): int s
        except TimeoutException:
            correct, error = False, None
            details["timeout"] = True
    else:
        try:
            correct, error = _call_with_timeout(_verify_texts, (gold_text, pred_text, None), timeout_s)
        except TimeoutError:
            correct, error = False, None
            details["timeout"] = True
        except Exception as e:  # the worker process itself failed
            correct, error = False, repr(e)
    if error is not None:
        details["error"] = error
    return GradeResult(1.0 if correct else -1.0, correct, shown, details)


@functools.lru_cache(maxsize=65536)
def math_equivalent(a: str, b: str) -> bool:
    """True if answer `b` grades correct against `a` as ground truth (cached: one problem's answers repeat)."""
    if a == b:
        return True
    if _PLAIN_NUMBER.fullmatch(a) and _PLAIN_NUMBER.fullmatch(b):
        return Fraction(a) == Fraction(b)  # fast path for plain numbers, where math-verify agrees
    return grade(f"\\boxed{{{b}}}", a, timeout_s=2.0).correct
