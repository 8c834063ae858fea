"""Grade many (verifier, response, ground truth) items in parallel, each within a time limit.

Items the verifier calls fast (`Verifier.is_fast`: no box, plain integers, letters) are graded inline: they take
microseconds. Verifiers that are not `in_workers` (most registered from outside tirl) run in threads of this
process; one that misses its deadline is reported {"timeout": True} and its thread abandoned. The rest go to a pool of spawned workers that stays alive between batches (importing sympy costs seconds). In a
worker, math-verify bounds each check with its own SIGALRM timeout (workers run items on their main thread), and
the parent adds a deadline for the whole batch; an item that misses it is reported with details
{"timeout": True}, never as a plain wrong answer, and the pool is killed and rebuilt so no stuck worker remains.
A pool whose worker died (the memory killer; Ctrl-C or a stop signal sent to the whole process group, which the
run itself answers by checkpointing after the step) is rebuilt and the items it lost are graded again once, so a
dead worker never turns a step's rewards into errors.
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
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from tirl.rewards.math import GradeResult, ignore_stop_signals
from tirl.rewards.registry import Verifier, get_verifier

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
    return get_verifier(name).fn(response, ground_truth, timeout_s=timeout_s)


def _call(fn: Any, response: str, ground_truth: Any, timeout_s: float) -> GradeResult:
    return fn(response, ground_truth, timeout_s=timeout_s)


def _work(item: tuple[str, str, Any], timeout_s: float) -> tuple[Any, str, Any, float]:
    """What a worker process runs: the function itself (pickled by its import path, so a verifier registered
    outside tirl needs no registration in the worker), the item, and the verifier's own time limit."""
    v = get_verifier(item[0])
    return v.fn, item[1], item[2], v.timeout_s or timeout_s


def _late(response: str, v: Verifier) -> GradeResult:
    return GradeResult(-1.0, False, v.extract(response), {"timeout": True})


_threads: concurrent.futures.ThreadPoolExecutor | None = None


def _grade_in_threads(
    items: Sequence[tuple[str, str, Any]], idx: list[int], timeout_s: float, workers: int
) -> dict[int, GradeResult]:
    """Verifiers that are not `in_workers`: a thread each, their own time limit (or `timeout_s`) per item."""
    global _threads
    with _lock:
        if _threads is None:
            _threads = concurrent.futures.ThreadPoolExecutor(max_workers=max(2, workers))
    out: dict[int, GradeResult] = {}
    futures = {}
    for i in idx:
        v = get_verifier(items[i][0])
        futures[i] = (_threads.submit(_grade_one, *items[i], v.timeout_s or timeout_s), v)
    limit = max((v.timeout_s or timeout_s) for _, v in futures.values()) if futures else 0.0
    deadline = limit * (math.ceil(len(idx) / max(2, workers)) + 1)
    concurrent.futures.wait([f for f, _ in futures.values()], timeout=deadline)
    for i, (f, v) in futures.items():
        if not f.done():
            out[i] = _late(items[i][1], v)
            continue
        try:
            out[i] = f.result()
        except Exception as e:  # a verifier bug grades that item as an error, never crashes the run
            out[i] = GradeResult(-1.0, False, None, {"error": f"verifier {v.name!r} raised {e!r}"})
    return out


def _get_pool(workers: int) -> ProcessPoolExecutor:
    global _pool, _pool_workers
    with _lock:
        if _pool is None or _pool_workers != workers:
            if _pool is not None:
                _kill(_pool)
            pool = ProcessPoolExecutor(
                max_workers=workers,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=ignore_stop_signals,
            )
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
    slow, threaded = [], []
    for i, (name, resp, truth) in enumerate(items):
        v = get_verifier(name)
        if v.needs_sandbox:
            raise ValueError(f"verifier {name!r} needs the sandbox: grade it with scoring.grade_responses")
        if v.is_fast is not None and v.is_fast(resp, truth):
            out[i] = _grade_one(name, resp, truth, timeout_s)
        elif v.in_workers:
            slow.append(i)
        else:
            threaded.append(i)
    for i, g in _grade_in_threads(items, threaded, timeout_s, workers or os.cpu_count() or 1).items():
        out[i] = g
    for retry in (False, True):  # once more for the items a dead worker lost
        slow = _grade_in_pool(items, slow, timeout_s, workers or os.cpu_count() or 1, out, last=retry)
        if not slow:
            break
    return [r for r in out if r is not None]


def _grade_in_pool(
    items: Sequence[tuple[str, str, Any]], idx: list[int], timeout_s: float, size: int,
    out: list[GradeResult | None], last: bool,
) -> list[int]:  # fmt: skip
    """Grade `idx` in the worker pool into `out`; returns the items a broken pool lost (none when `last`: they
    are graded as errors then)."""
    if not idx:
        return []
    pool = _get_pool(size)  # sized by the config, not the batch: a resized pool would re-import sympy
    try:
        futures = {pool.submit(_call, *_work(items[i], timeout_s)): i for i in idx}
    except BrokenProcessPool as e:  # a worker died between batches
        _discard(pool)
        if not last:
            return idx
        for i in idx:
            out[i] = GradeResult(-1.0, False, None, {"error": repr(e)})
        return []
    # every worker gets its share of items, each allowed timeout_s, plus one item's worth of slack
    deadline = timeout_s * (math.ceil(len(idx) / min(len(idx), size)) + 1)
    done, late = concurrent.futures.wait(futures, timeout=deadline)
    lost = []
    for f in done:
        if not last and isinstance(f.exception(), BrokenProcessPool):
            lost.append(futures[f])
            continue
        try:
            out[futures[f]] = f.result()
        except Exception as e:  # a worker died twice, or the verifier raised in it
            out[futures[f]] = GradeResult(-1.0, False, None, {"error": repr(e)})
    for f in late:
        name, resp = items[futures[f]][:2]
        out[futures[f]] = _late(resp, get_verifier(name))
    if late or any(f.exception() is not None for f in done):
        _discard(pool)
    return lost
