"""Where a step's time goes (`perf/step_s/<phase>`), throughput and peak memory: the numbers people read first."""

from __future__ import annotations

import resource
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager

import torch


class Timers:
    """Wall seconds per phase, accumulated until `pop()`; phases may repeat (dynamic sampling rounds)."""

    def __init__(self) -> None:
        self._s: dict[str, float] = defaultdict(float)

    @contextmanager
    def time(self, phase: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._s[phase] += time.perf_counter() - t0

    def pop(self) -> dict[str, float]:
        out = {f"perf/step_s/{k}": v for k, v in self._s.items()}
        self._s.clear()
        return out


def peak_memory_mb() -> dict[str, float]:
    """Peak resident memory of this process (CPU) and, where CUDA is in use, the peak allocated on the device."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    out = {"perf/peak_rss_mb": rss / (1024 * 1024 if sys.platform == "darwin" else 1024)}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["perf/peak_cuda_mb"] = torch.cuda.max_memory_allocated() / 2**20
    return out
