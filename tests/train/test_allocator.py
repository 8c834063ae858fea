"""oneDNN's per-shape caches are bounded: bf16 autocast over changing shapes must not grow the process."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys

import pytest
import torch

from tirl.train.allocator import ONEDNN_CACHE_VARS, bound_onednn_caches

# One Linear the size of SmolLM2's MLP projections under bf16 autocast, forward and backward, at 200 token counts
# (as the micro-batches of RL steps): prints how many MiB glibc's heap holds in use more than before.
GROWTH = """
import ctypes, json, os, sys
from tirl.train.allocator import bound_onednn_caches
if sys.argv[1] == "bounded":
    bound_onednn_caches()
import torch

class MallInfo(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo

def in_use():
    m = libc.mallinfo2()
    return (m.uordblks + m.hblkhd) / 2**20

torch.manual_seed(0)
torch.set_num_threads(1)
w = torch.randn(1536, 576, requires_grad=True)
warm = None
for i in range(220):
    x = torch.randn(64 + 3 * i, 576)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = torch.nn.functional.linear(x, w)
    y.float().sum().backward()
    if i == 19:
        warm = in_use()
print(json.dumps({"growth_mib": in_use() - warm, "env": {k: os.environ.get(k) for k in sys.argv[2:]}}))
"""


def _glibc_mallinfo2() -> bool:
    try:
        return hasattr(ctypes.CDLL("libc.so.6"), "mallinfo2")
    except OSError:
        return False


def _growth(mode: str, env: dict[str, str]) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", GROWTH, mode, *ONEDNN_CACHE_VARS],
        capture_output=True, text=True, timeout=300, env=env, check=True,
    )  # fmt: skip
    return json.loads(out.stdout.splitlines()[-1])


@pytest.mark.skipif(not _glibc_mallinfo2(), reason="needs glibc's mallinfo2 to read the heap in use")
@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="PyTorch built without oneDNN")
def test_bf16_autocast_over_changing_shapes_stays_bounded():
    base = {k: v for k, v in os.environ.items() if k not in ONEDNN_CACHE_VARS}
    unbounded = _growth("unbounded", {**base, **dict.fromkeys(ONEDNN_CACHE_VARS, "1024")})
    if unbounded["growth_mib"] < 100:
        pytest.skip(f"this PyTorch/oneDNN keeps no per-shape weights ({unbounded['growth_mib']:.0f} MiB)")
    bounded = _growth("bounded", base)
    assert bounded["env"] == dict.fromkeys(ONEDNN_CACHE_VARS, str(64))
    # 200 shapes kept about one bf16 weight (1.7 MiB) each without the bound; with it, at most the caches' entries
    assert bounded["growth_mib"] < 0.25 * unbounded["growth_mib"], (bounded, unbounded)
    assert bounded["growth_mib"] < 80, bounded


def test_a_users_cache_settings_win(monkeypatch):
    monkeypatch.setenv("LRU_CACHE_CAPACITY", "4096")
    monkeypatch.delenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", raising=False)
    got = bound_onednn_caches(32)
    assert got == {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "32", "LRU_CACHE_CAPACITY": "4096"}
