"""Time limits that grow with the work asked for, so a 20k-token turn is not killed by a limit sized for 200.

A request's limit is `base_s + budget / rate`: `base_s` covers queueing and prefill (`rollout.request_timeout_s`),
and `rate` is the decode rate in tokens per second assumed for one request. Before anything is measured, `rate` is
`rollout.min_tokens_per_s`. Each answered request then reports its rate (sampled tokens over wall time); the limit
uses half the slowest rate seen when that is lower than the floor, so a loaded server (a CPU shared with the
trainer, a GPU batching many long requests) gets more time, never less than the floor allows. A trajectory's limit
(the async loop's watchdog) is `rollout.timeout_s` plus its whole response budget at the floor rate.
"""

from __future__ import annotations

import threading

MIN_MEASURED_TOKENS = 16  # shorter answers say more about queueing and prefill than about the decode rate


class Throughput:
    """The slowest per-request decode rate seen so far, and the limits it implies (thread-safe)."""

    def __init__(self, floor_tps: float) -> None:
        if floor_tps <= 0:
            raise ValueError(f"rollout.min_tokens_per_s must be > 0, got {floor_tps}")
        self.floor_tps = floor_tps
        self.slowest_tps: float | None = None
        self._lock = threading.Lock()

    def observe(self, tokens: int, seconds: float) -> None:
        if tokens < MIN_MEASURED_TOKENS or seconds <= 0:
            return
        with self._lock:
            rate = tokens / seconds
            self.slowest_tps = rate if self.slowest_tps is None else min(self.slowest_tps, rate)

    def rate(self) -> float:
        """Tokens per second to plan with: the floor, or half the slowest measured rate when that is lower."""
        with self._lock:
            if self.slowest_tps is None:
                return self.floor_tps
            return min(self.floor_tps, self.slowest_tps / 2)

    def limit(self, base_s: float, budget_tokens: int) -> float:
        """Seconds allowed for work of `budget_tokens` sampled tokens on top of `base_s`."""
        return base_s + max(budget_tokens, 0) / self.rate()
