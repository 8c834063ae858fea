"""The module the static decode (`tirl.rollout.engines.torch.graph_decode`) runs: the policy's own layers and tensors, with
two differences that a CUDA graph needs and that must not touch the trainer's module.

- **Attention over grouped heads.** Each layer attends through `grouped_decode_attention`, registered with
  transformers as `STATIC_ATTENTION`: the step's one query token per row is read as the G query heads of each
  key/value head, (B, Hq, 1, D) -> (B, Hkv, G, D), so one attention call runs on the cache as it is.
  transformers' SDPA wrapper instead expands grouped keys and values to every query head (`repeat_kv`) whenever
  there is a mask (some versions; all of them under torch.compile): a copy of the whole cache capacity at every
  layer of every step. SDPA's own `enable_gqa=True` is not used: with a mask it falls back on CUDA to the math
  kernel (transformers' `use_gqa_in_sdpa` says as much), which expands the heads itself; the folded query is
  exact for one query token and runs on any kernel that takes a mask.
- **bf16 weights under bf16 autocast.** A graph captured under autocast records its casts: with fp32 master
  weights every replay would cast every weight again (3x the weight traffic of the step itself). The view holds
  a bf16 copy of each Linear's weight and bias, the only weights autocast casts, refreshed in place
  (`RolloutWeights.refresh`) when the trainer changed them, so a graph's addresses stay valid. Autocast's cast of
  an fp32 weight and the copy are the same bits, so the step computes what the eager engine's autocast does; the
  norms and the embedding stay the trainer's fp32 tensors (autocast leaves them in fp32 too).

The view is a `copy.deepcopy` of the module tree with every parameter and buffer taken over as it is (shared, no
copy), then the Linears' weights replaced (and the tied LM head untied from the embedding, in the view only) and
the view's own config switched to `STATIC_ATTENTION`. Deliberately not here: the arena, the loop, the capture.
"""

from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass, field

import torch
from transformers import AttentionInterface

STATIC_ATTENTION = "tirl_static_decode"
# keyword arguments a model may pass its attention that change what attention computes: refused, not ignored
UNSUPPORTED = ("softcap", "sliding_window", "s_aux", "position_bias")


def grouped_decode_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """One decode token's attention: query (B, Hq, 1, D) over key/value (B, Hkv, C, D) under a boolean mask
    (B, 1, 1, C); returns (B, 1, Hq, D) as transformers' attention functions do. q and k are cast to the cache's
    dtype (v's), what autocast does to SDPA's inputs anyway."""
    bad = [k for k in UNSUPPORTED if kwargs.get(k) is not None]
    if bad or dropout or query.shape[2] != 1:
        raise ValueError(f"the static decode step attends one token without {', '.join(UNSUPPORTED)}: {bad}")
    B, Hq, _, D = query.shape
    Hkv = key.shape[1]
    q = query.reshape(B, Hkv, Hq // Hkv, D).to(value.dtype)  # query head h reads key/value head h // G
    out = torch.nn.functional.scaled_dot_product_attention(
        q, key.to(value.dtype), value, attn_mask=attention_mask, scale=scaling
    )  # (B, Hkv, G, D)
    return out.reshape(B, 1, Hq, D), None


AttentionInterface.register(STATIC_ATTENTION, grouped_decode_attention)


@dataclass
class RolloutWeights:
    """The view module and its bf16 copies, each with the trainer's tensor it copies."""

    module: torch.nn.Module
    copies: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)  # (copy, source)
    _seen: list[tuple[int, int]] = field(default_factory=list)  # each source's (address, version) at its copy

    def refresh(self, every: bool = False) -> bool:
        """Copy in place each source the trainer changed since (an optimizer step bumps its version counter), or
        `every` one (a weight sync: a write through `.data` bumps no counter); True when any was copied."""
        now = [(s.data_ptr(), s._version) for _, s in self.copies]
        stale = [i for i, key in enumerate(now) if every or i >= len(self._seen) or self._seen[i] != key]
        with torch.no_grad():
            for i in stale:
                dst, src = self.copies[i]
                dst.copy_(src)
        self._seen = now
        return bool(stale)


def rollout_weights(model: torch.nn.Module, dtype: torch.dtype | None) -> RolloutWeights:
    """The view of `model` the static step runs (module docstring); with `dtype` (autocast's), the Linears'
    weights and biases as copies in it, unless already so."""
    shared = itertools.chain(model.parameters(), model.buffers())
    view = copy.deepcopy(model, memo={id(t): t for t in shared})
    view.config._attn_implementation = STATIC_ATTENTION
    view.eval()  # the view only decodes (no dropout), whatever mode the trainer's module is in
    out = RolloutWeights(view)
    for m in view.modules():
        if dtype is None or not isinstance(m, torch.nn.Linear):
            continue
        for name in ("weight", "bias"):
            src = getattr(m, name)
            if src is None or src.dtype == dtype:
                continue
            dst = torch.nn.Parameter(torch.empty_like(src, dtype=dtype), requires_grad=False)
            m._parameters[name] = dst  # the view's module only: the trainer's keeps its fp32 parameter
            out.copies.append((dst, src))
    out.refresh()
    return out
