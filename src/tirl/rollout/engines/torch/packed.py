"""Linears over weights packed once for oneDNN: how the torch engine runs its decode steps on a CPU.

Two precisions, one mechanism:
- bf16 (`rollout.dtype: bfloat16`). Under `torch.autocast`, each `nn.Linear` call hands oneDNN a bf16 weight in the
  plain (N, K) layout, which oneDNN reorders into its blocked layout (the AMX / AVX512-BF16 tiles) on every call.
  At a decode step's few rows that reorder costs as much as the product: SmolLM2's 576 x 1536 projection for 16
  rows took 128 us a call under autocast and 78 us with its weight packed once (2 cores, AMX, weights not in
  cache; 64 rows: 244 against 97 us). Packed calls take at most `MAX_ROWS` rows; larger passes (a long pre-fill)
  take autocast's path, where the reorder is amortized.
- fp32. PyTorch multiplies fp32 on a CPU with MKL, whose kernels on AMD CPUs stop at AVX2: on an AVX-512 EPYC
  (2 cores) a 2048^2 fp32 matmul ran at 208 GFLOP/s, the AVX2 peak, against 479 through oneDNN, and SmolLM2's
  decode-step products at 16 rows read the weights at 8-12 GB/s where the cores read 46. oneDNN's fp32 kernels over
  a packed weight ran those products 1.5-4.3x as fast (2.1-2.5x on the MLP and attention projections, 4.3x on the
  LM head; `bench/linear_kernels.py`). The numbers are fp32 products in another summation order: within float
  rounding of MKL's (greedy ids unchanged in the benchmarks), so the engine's log-probs still count as the
  trainer's. `rollout.torch.pack: auto` packs fp32 weights where this was measured to pay: MKL as PyTorch's BLAS on an
  AMD CPU, and a model at least `MIN_CPU_HIDDEN` (512) wide (on the demo's 192-wide one a step is mostly
  per-operation overhead and the packed engine ran 0.92-1.05x). On Intel CPUs MKL runs their full vector width and
  the gain is unmeasured, so `auto` leaves fp32 there to MKL.

`PackedLinears` casts and reorders each Linear's weight once (`torch.ops.mkldnn._reorder_linear_weight`, the
packing PyTorch's Inductor uses for CPU inference) and, while `active()`, routes the Linears' no-grad forwards
through `torch.ops.mkldnn._linear_pointwise`. Anything with grad enabled (a training forward) takes the module's
own forward, so the trainer never runs on a pack.

A pack is tied to its weight's storage and version counter, so an optimizer step (an in-place update) or new
weights make it stale and it is rebuilt at the next `active()`; nothing needs to be told when the policy changes.

Not here: GPUs (cuBLAS is fast as it is), `torch.compile` (Inductor cannot lower a packed weight that is no
constant; the compiled engine keeps plain Linears), sharded weights (FSDP2's DTensors) and Linear subclasses with
a forward of their own (left alone).
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator
from functools import cache

import torch

from tirl.models.precision import MIN_CPU_HIDDEN, cpu_vendor

# bf16: rows per call up to which the packed path runs; beyond it autocast's reorder is amortized
MAX_ROWS = 256
PACK_MODES = ("auto", "on", "off")
_PACKABLE = (torch.float32, torch.bfloat16)


@cache
def packing_available(dtype: torch.dtype = torch.bfloat16) -> bool:
    """oneDNN's packed linear runs here in `dtype` (float32 or bfloat16): PyTorch has it and it gives plain
    `F.linear`'s numbers (a probe)."""
    if dtype not in _PACKABLE:
        return False
    if not torch.backends.mkldnn.is_available() or not hasattr(torch.ops.mkldnn, "_linear_pointwise"):
        return False
    try:
        w = torch.randn(8, 16).to(dtype)
        x = torch.randn(3, 16).to(dtype)
        y = torch.ops.mkldnn._linear_pointwise(
            x, torch.ops.mkldnn._reorder_linear_weight(w, None), None, "none", [], ""
        )
        return bool(torch.allclose(y.float(), torch.nn.functional.linear(x, w).float(), atol=1e-2, rtol=1e-2))
    except (RuntimeError, NotImplementedError):
        return False


def mkl_fp32_below_width() -> bool:
    """PyTorch multiplies fp32 through MKL on a CPU whose vector width MKL's kernels do not use (AMD's)."""
    return torch.backends.mkl.is_available() and cpu_vendor() == "AuthenticAMD"


def packing_pays(dtype: torch.dtype, hidden_size: int) -> bool:
    """`rollout.torch.pack: auto`: bf16 decode always (its reorder per call is the cost packing removes); fp32 where
    PyTorch's own fp32 path runs below the CPU's width and the model is at least `MIN_CPU_HIDDEN` wide, so that the
    products outweigh the per-operation overhead (module docstring)."""
    if dtype == torch.bfloat16:
        return True
    return hidden_size >= MIN_CPU_HIDDEN and mkl_fp32_below_width()


class PackedLinears:
    """The packed `dtype` weights of every plain `nn.Linear` of `model` (on a CPU), rebuilt where stale."""

    def __init__(self, model: torch.nn.Module, dtype: torch.dtype = torch.bfloat16) -> None:
        if dtype not in _PACKABLE:
            raise ValueError(f"oneDNN packing is for float32 or bfloat16 weights, not {dtype}")
        self.dtype = dtype
        self.max_rows = MAX_ROWS if dtype == torch.bfloat16 else None
        self.linears = [
            m
            for m in model.modules()
            if type(m) is torch.nn.Linear
            and m.weight.device.type == "cpu"
            and type(m.weight.data) is torch.Tensor
        ]
        self._packs: dict[int, tuple[tuple[int, int], torch.Tensor, torch.Tensor | None]] = {}
        self._lock = threading.Lock()
        self._active = 0  # concurrent `active()` contexts (the async agent loop calls generate from threads)

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """Route the Linears' no-grad forwards through their packed weights until exit."""
        with self._lock:
            if self._active == 0:
                self._refresh()
                for m in self.linears:  # an instance attribute: the class's forward stays as it is
                    _, weight, bias = self._packs[id(m)]
                    m.forward = functools.partial(_packed_forward, m, weight, bias, self.dtype, self.max_rows)
            self._active += 1
        try:
            yield
        finally:
            with self._lock:
                self._active -= 1
                if self._active == 0:
                    for m in self.linears:
                        del m.forward

    def _refresh(self) -> None:
        """Pack each weight whose storage or version changed since its pack was made."""
        for m in self.linears:
            w = m.weight
            key = (w.data_ptr(), w._version)
            held = self._packs.get(id(m))
            if held is None or held[0] != key:
                with torch.no_grad():
                    packed = torch.ops.mkldnn._reorder_linear_weight(w.detach().to(self.dtype), None)
                    bias = None if m.bias is None else m.bias.detach().to(self.dtype)
                self._packs[id(m)] = (key, packed, bias)

    def clear(self) -> None:
        """Drop every pack (the memory of a copy of the weights)."""
        with self._lock:
            self._packs.clear()


def _packed_forward(
    module: torch.nn.Linear,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    dtype: torch.dtype,
    max_rows: int | None,
    x: torch.Tensor,
) -> torch.Tensor:
    if torch.is_grad_enabled() or (max_rows is not None and x.numel() // max(x.shape[-1], 1) > max_rows):
        return torch.nn.Linear.forward(module, x)
    return torch.ops.mkldnn._linear_pointwise(x.to(dtype), weight, bias, "none", [], "")


__all__ = [
    "MAX_ROWS",
    "PACK_MODES",
    "PackedLinears",
    "mkl_fp32_below_width",
    "packing_available",
    "packing_pays",
]
