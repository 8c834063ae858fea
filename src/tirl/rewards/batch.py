"""Grade many (verifier, response, ground truth) items in parallel worker processes, each within a time limit.

Items decided without sympy (no box, plain integers, letters) are graded inline: they take microseconds. The
rest go to a pool of spawned workers that stays alive between batches (importing sympy costs seconds). In a
worker, math-verify bounds each check with its own SIGALRM timeout (workers run items on their main thread), and
the parent adds a deadline for the whole batch; an item that misses it is reported with details
{"timeout": True}, never as a plain wrong answer, and the pool is killed and rebuilt so no stuck worker remains.
"""

from __future__ import annotations

import concurrent.futures
import logging
import math
import multiprocessing
import os
import threading
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from tirl.rewards.math import GradeResult, _as_int, last_boxed
from tirl.rewards.registry import VERIFIERS

_STARTUP_S = 120.0
_pool: ProcessPoolExecutor | None = None
_pool_workers = 0
_lock = threading.Lock()


def _warm() -> int:
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    from math_verify import parse

    parse("$1$")
    return os.getpid()


def _grade_one(name: str, response: str, ground_truth: Any, timeout_s: float) -> GradeResult:
    return VERIFIERS[name](response, ground_truth, timeout_s=timeout_s)


def _is_fast(name: str, response: str, ground_truth: Any) -> bool:
    if name == "choice":
        return True
    pred = last_boxed(response)
    return pred is None or (_as_int(pred) is not None and _as_int(str(ground_truth)) is not None)


def _get_pool(workers: int) -> ProcessPoolExecutor:
    global _pool, _pool_workers
    with _lock:
        if _pool is None or _pool_workers != workers:
            if _pool is not None:
                _kill(_pool)
            pool = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"))
            for f in [pool.submit(_warm) for _ in range(workers)]:
                f.result(timeout=_STARTUP_S)
            _pool, _pool_workers = pool, workers
        return _pool


def _kill(pool: ProcessPoolExecutor) -> None:
    for proc in list((getattr(pool, "_processes", None) or {}).values()):
        proc.kill()
    pool.shutdown(wait=False, cancel_futures=True)


def _discard(pool: ProcessPoolExecutor) -> None:
    global _pool
    with _lock:
        if _pool is pool:
            _pool = None
    _kill(pool)


def grade_many(
    items: Sequence[tuple[str, str, Any]], *, workers: int = 0, timeout_s: float = 5.0
) -> list[GradeResult]:
    """One GradeResult per (verifier name, response, ground truth), in order."""
    out: list[GradeResult | None] = [None] * len(items)
    slow = []
    for i, (name, resp, truth) in enumerate(items):
        if name not in VERIFIERS:
            raise ValueError(f"unknown verifier {name!r}; valid: {', '.join(VERIFIERS)}")
        if _is_fast(name, resp, truth):
            out[i] = _grade_one(name, resp, truth, timeout_s)
        else:
            slow.append(i)
    if slow:
        size = workers or os.cpu_count() or 1
        pool = _get_pool(size)  # sized by the config, not the batch: a resized pool would re-import sympy
        n = min(len(slow), size)
        futures = {pool.submit(_grade_one, *items[i], timeout_s): i for i in slow}
        # every worker gets its share of items, each allowed timeout_s, plus one item's worth of slack
        deadline = timeout_s * (math.ceil(len(slow) / n) + 1)
        done, late = concurrent.futures.wait(futures, timeout=deadline)
        for f in done:
            try:
                out[futures[f]] = f.result()
            except Exception as e:  # a worker died (e.g. killed by memory pressure)
                out[futures[f]] = GradeResult(-1.0, False, None, {"error": repr(e)})
        for f in late:
            resp = items[futures[f]][1]
            out[futures[f]] = GradeResult(-1.0, False, last_boxed(resp), {"timeout": True})
        if late or any(f.exception() is not None for f in done):
            _discard(pool)
    return [r for r in out if r is not None]
