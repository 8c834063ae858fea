"""glibc's allocator in a training process: large freed blocks kept for reuse rather than handed back to the kernel.

Every forward/backward pass allocates and frees the same large tensors (activations, a chunk of logits, each
weight's gradient). glibc serves blocks above its mmap threshold (32 MiB at most) from fresh mappings that it unmaps
when they are freed, so each pass faults those pages in again: one `tirl demo` took 11 million minor page faults.
With mmap off for the heap's blocks (M_MMAP_MAX 0) and a trim threshold of 2 GiB, they come from the heap and are
reused: SmolLM2's RL update on 2 cores ran 8% faster (docs/benchmarks.md). The cost: the heap does not shrink, so
the resident size stays nearer its peak.

Linux with glibc only (a no-op elsewhere); `TIRL_MALLOC=system` keeps glibc's defaults.
"""

from __future__ import annotations

import ctypes
import os

M_TRIM_THRESHOLD = -1  # mallopt parameters, from glibc's malloc.h
M_MMAP_MAX = -4
TRIM_THRESHOLD = 2**31 - 1  # the largest an int takes


def keep_freed_memory() -> bool:
    """Set this process's allocator as the module docstring says; True if glibc took the settings."""
    if os.environ.get("TIRL_MALLOC", "").strip().lower() == "system":
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))


__all__ = ["keep_freed_memory"]
