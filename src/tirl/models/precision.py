"""Whether bf16 autocast pays on this machine for this model: what `model.autocast: auto` (the default) decides.

bf16 autocast pays only where bf16 matmuls are native: every recent GPU, and CPUs with AVX512-BF16 or AMX (a 2-core
Xeon with both: 2048^2 matmuls 4.3x faster than fp32, SmolLM2-135M's forward/backward 2.0x). Elsewhere the CPU
emulates bf16 and the same update runs 14x slower (0.07x, measured on an AVX2 machine), so `auto` detects rather
than assumes: on a CPU from its /proc/cpuinfo flags, on CUDA from torch. On a CPU it also needs a model wide
enough that the matmuls outweigh autocast's casts: the demo's 192-wide model on that Xeon ran its warm-up 0.65x
and its SFT 1.36x as fast under bf16, and its RL steps slower, against SmolLM2's (576 wide) 2.0x; below
MIN_CPU_HIDDEN the CPU stays in fp32. On a GPU bf16 is the standard choice at any width.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

BF16_CPU_FLAGS = ("amx_bf16", "avx512_bf16")
REPORTED_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")
MIN_CPU_HIDDEN = 512


@cache
def _cpuinfo(key: str) -> str:
    """The value of /proc/cpuinfo's first `key` line; "" where there is none or the file cannot be read (not
    Linux)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""
    for line in text.splitlines():
        name, sep, value = line.partition(":")
        if sep and name.strip() == key:
            return value.strip()
    return ""


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (empty where /proc/cpuinfo cannot be read: not Linux)."""
    return frozenset(_cpuinfo("flags").split())


def cpu_vendor() -> str:
    """/proc/cpuinfo's vendor_id ("GenuineIntel", "AuthenticAMD", ...); "" where it cannot be read."""
    return _cpuinfo("vendor_id")


def cpu_description() -> dict[str, object]:
    """The CPU's model name, its core count and the flags that decide precision here: what a benchmark or a
    multi-seed demo records beside its numbers, since float-level results move between CPUs."""
    import os
    import platform

    return {
        "cpu": _cpuinfo("model name") or platform.processor() or platform.machine(),
        "vendor": cpu_vendor(),
        "cores": os.cpu_count(),
        "flags": sorted(cpu_flags() & set(REPORTED_FLAGS)),
    }


def native_bf16(device: str) -> bool:
    """bf16 matmuls run natively on `device` ("cpu", "cuda", "cuda:1", ...)."""
    if device.startswith("cuda"):
        import torch

        return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    return any(f in cpu_flags() for f in BF16_CPU_FLAGS)


def bf16_pays(device: str, hidden_size: int) -> bool:
    """bf16 autocast is faster than fp32 for a model of `hidden_size` on `device` (module docstring)."""
    if device.startswith("cuda"):
        return native_bf16(device)
    return hidden_size >= MIN_CPU_HIDDEN and native_bf16(device)


__all__ = [
    "BF16_CPU_FLAGS",
    "MIN_CPU_HIDDEN",
    "bf16_pays",
    "cpu_description",
    "cpu_flags",
    "cpu_vendor",
    "native_bf16",
]
