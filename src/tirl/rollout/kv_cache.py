"""A KV cache written in place: one buffer per layer, allocated at the prompt's pre-fill for the whole generation.

transformers' `DynamicCache` grows by `torch.cat`: every decode step copies the whole cache of every layer, so a
step costs time linear in the length so far and a generation quadratic (23% of a decode step at batch 64 on the
demo model). `StaticCache` writes in place but attends over its full capacity at every step. This cache does
neither: each layer's keys and values live in a buffer of `capacity` positions, a step writes its token at the
next position, and attention reads a view of the positions written so far. Dropping finished rows indexes the
buffers once (`batch_select_indices`), as `DynamicCache` does.

Semantics are `DynamicCache`'s (the same mask sizes, the same values attended), so greedy ids are the same to the
bit where the attention kernel gives the same sums over a strided view as over a contiguous tensor (tested).
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


class InPlaceLayer(DynamicLayer):
    """One layer's cache: `capacity` positions preallocated, `length` of them written."""

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity, self.length = capacity, 0
        self._k: torch.Tensor | None = None
        self._v: torch.Tensor | None = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        b, h, _, d = key_states.shape
        self.dtype, self.device = key_states.dtype, key_states.device
        self._k = key_states.new_empty((b, h, self.capacity, d))
        self._v = value_states.new_empty((b, value_states.shape[1], self.capacity, value_states.shape[-1]))
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n = key_states.shape[-2]
        end = self.length + n
        if end > self.capacity:
            raise RuntimeError(f"KV cache full: {end} positions written, capacity {self.capacity}")
        self._k[:, :, self.length : end] = key_states
        self._v[:, :, self.length : end] = value_states
        self.length = end
        self.keys, self.values = self._k[:, :, :end], self._v[:, :, :end]
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.is_initialized:
            self._k, self._v = self._k[indices], self._v[indices]
            self.keys, self.values = self._k[:, :, : self.length], self._v[:, :, : self.length]

    def reset(self) -> None:
        self._k = self._v = None
        self.length = 0
        super().reset()

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("the rollout engine's cache is never cropped")

    def batch_repeat_interleave(self, repeats: int) -> None:
        raise NotImplementedError("the rollout engine's cache is never repeated")


class InPlaceCache(DynamicCache):
    """A `DynamicCache` whose layers are `InPlaceLayer`s of `capacity` positions (prompt plus new tokens)."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"KV cache capacity must be >= 1, got {capacity}")
        super().__init__()
        self.layer_class_to_replicate = lambda: InPlaceLayer(capacity)
