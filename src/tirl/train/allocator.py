"""The training process's memory settings: glibc keeps freed blocks for reuse, and oneDNN's per-shape caches are
bounded.

Every forward/backward pass allocates and frees the same large tensors (activations, a chunk of logits, each
weight's gradient). glibc serves blocks above its mmap threshold (32 MiB at most) from fresh mappings that it unmaps
when they are freed, so each pass faults those pages in again: one `tirl demo` took 11 million minor page faults.
With mmap off for the heap's blocks (M_MMAP_MAX 0) and a trim threshold of 2 GiB, they come from the heap and are
reused: SmolLM2's RL update on 2 cores ran 8% faster (docs/benchmarks.md). The cost: the heap does not shrink, so
the resident size stays nearer its peak. Linux with glibc only (a no-op elsewhere); `TIRL_MALLOC=system` keeps
glibc's defaults.

oneDNN, which runs PyTorch's bf16 matmuls on a CPU, keeps what it builds for each matrix shape (a primitive, and in
PyTorch's ideep layer a weight laid out for it) in two caches of 1,024 entries each. RL passes change shape at
every micro-batch, so under bf16 autocast each new shape kept about one more bf16 copy of a weight: SmolLM2's RL
process (4 prompts x 8 rollouts a step) grew by 270 MB of resident memory a step (3.0 GB after step 1, 6.0 GB
after step 12), and a single Linear under autocast over 400 shapes by 450 MB. `bound_onednn_caches` caps both
caches (ONEDNN_PRIMITIVE_CACHE_CAPACITY and ideep's LRU_CACHE_CAPACITY, read when the first oneDNN operation runs)
unless the user set them; with 64 entries the same run stays at 4.1 GB from step 4 on.
"""

from __future__ import annotations

import ctypes
import os

M_TRIM_THRESHOLD = -1  # mallopt parameters, from glibc's malloc.h
M_MMAP_MAX = -4
TRIM_THRESHOLD = 2**31 - 1  # the largest an int takes
ONEDNN_CACHE_ENTRIES = 64  # per cache; see bound_onednn_caches
ONEDNN_CACHE_VARS = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")


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


def bound_onednn_caches(entries: int = ONEDNN_CACHE_ENTRIES) -> dict[str, str]:
    """Cap oneDNN's per-shape caches at `entries` each, where the environment does not already set them; returns
    the values in force. Effective only before this process's first oneDNN operation, so `setup_torch` calls it
    before any tensor work."""
    for var in ONEDNN_CACHE_VARS:
        os.environ.setdefault(var, str(entries))
    return {var: os.environ[var] for var in ONEDNN_CACHE_VARS}


__all__ = ["bound_onednn_caches", "keep_freed_memory"]
