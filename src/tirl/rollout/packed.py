"""bf16 decode over weights packed once for oneDNN: what the torch engine runs for `rollout.dtype: bfloat16` on a CPU.

Under `torch.autocast`, each `nn.Linear` call hands oneDNN a bf16 weight in the plain (N, K) layout, which oneDNN
reorders into its blocked layout (the AMX / AVX512-BF16 tiles) on every call. At a decode step's few rows that
reorder costs as much as the product: SmolLM2's 576 x 1536 projection for 16 rows took 128 us a call under
autocast and 78 us with its weight packed once (2 cores, AMX, weights not in cache; 64 rows: 244 against 97 us).
`PackedLinears` casts and reorders each Linear's weight once (`torch.ops.mkldnn._reorder_linear_weight`, the
packing PyTorch's Inductor uses for CPU inference) and, while `active()`, routes the Linears' no-grad forwards of at
most `MAX_ROWS` rows through `torch.ops.mkldnn._linear_pointwise`: bf16 products accumulated in fp32, as under
autocast. Larger passes (a long pre-fill) and anything with grad enabled take the module's own forward.

A pack is tied to its weight's storage and version counter, so an optimizer step (an in-place update) or new
weights make it stale and it is rebuilt at the next `active()`; nothing needs to be told when the policy changes.

Not here: fp32 (MKL's packed sgemm keeps ~2x the weights plus 9 MB per matrix and gained 9% in place), GPUs
(autocast there is already fast), Linear subclasses with a forward of their own (left alone).
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator
from functools import cache

import torch

MAX_ROWS = 256  # rows per call up to which the packed path runs; beyond it autocast's reorder is amortized


@cache
def packing_available() -> bool:
    """oneDNN's packed bf16 linear runs here: PyTorch has it and it gives plain `F.linear`'s numbers (a probe)."""
    if not torch.backends.mkldnn.is_available() or not hasattr(torch.ops.mkldnn, "_linear_pointwise"):
        return False
    try:
        w = torch.randn(8, 16).bfloat16()
        x = torch.randn(3, 16).bfloat16()
        y = torch.ops.mkldnn._linear_pointwise(
            x, torch.ops.mkldnn._reorder_linear_weight(w, 4), None, "none", [], ""
        )
        return bool(torch.allclose(y.float(), torch.nn.functional.linear(x, w).float(), atol=1e-2, rtol=1e-2))
    except (RuntimeError, NotImplementedError):
        return False


class PackedLinears:
    """The packed bf16 weights of every plain `nn.Linear` of `model` (on a CPU), rebuilt where stale."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.linears = [
            m for m in model.modules() if type(m) is torch.nn.Linear and m.weight.device.type == "cpu"
        ]
        self._packs: dict[int, tuple[tuple[int, int], torch.Tensor, torch.Tensor | None]] = {}
        self._lock = threading.Lock()
        self._active = 0  # concurrent `active()` contexts (the async agent loop calls generate from threads)

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """Route the Linears' small no-grad forwards through their packed weights until exit."""
        with self._lock:
            if self._active == 0:
                self._refresh()
                for m in self.linears:  # an instance attribute: the class's forward stays as it is
                    _, weight, bias = self._packs[id(m)]
                    m.forward = functools.partial(_packed_forward, m, weight, bias)
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
                    packed = torch.ops.mkldnn._reorder_linear_weight(w.detach().to(torch.bfloat16), None)
                    bias = None if m.bias is None else m.bias.detach().to(torch.bfloat16)
                self._packs[id(m)] = (key, packed, bias)

    def clear(self) -> None:
        """Drop every pack (the memory of a bf16 copy of the weights)."""
        with self._lock:
            self._packs.clear()


def _packed_forward(
    module: torch.nn.Linear, weight: torch.Tensor, bias: torch.Tensor | None, x: torch.Tensor
) -> torch.Tensor:
    rows = x.numel() // max(x.shape[-1], 1)
    if torch.is_grad_enabled() or rows > MAX_ROWS:
        return torch.nn.Linear.forward(module, x)
    return torch.ops.mkldnn._linear_pointwise(x.to(torch.bfloat16), weight, bias, "none", [], "")


__all__ = ["MAX_ROWS", "PackedLinears", "packing_available"]
