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

import threading

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


def stored_dtype(states: torch.Tensor) -> torch.dtype:
    """The dtype a layer keeps keys or values in: autocast's where autocast is on and they are float32 (Qwen3's key
    norm returns float32 keys under bf16 autocast). Attention casts them to that dtype when it reads them anyway
    (it is on autocast's lower-precision list), so storing them cast changes no number and halves their memory."""
    dev = states.device.type
    if states.dtype == torch.float32 and torch.is_autocast_enabled(dev):
        return torch.get_autocast_dtype(dev)
    return states.dtype


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
        self._k = key_states.new_empty((b, h, self.capacity, d), dtype=stored_dtype(key_states))
        v_shape = (b, value_states.shape[1], self.capacity, value_states.shape[-1])
        self._v = value_states.new_empty(v_shape, dtype=stored_dtype(value_states))
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
        if self.is_initialized:  # only the written positions are copied, not the whole capacity
            n = self.length
            self._k, self._v = (self._select(t, indices, n) for t in (self._k, self._v))
            self.keys, self.values = self._k[:, :, :n], self._v[:, :, :n]

    @staticmethod
    def _select(buf: torch.Tensor, indices: torch.Tensor, n: int) -> torch.Tensor:
        """A new buffer of the selected rows, their first `n` positions copied and the rest left for new tokens."""
        out = buf.new_empty((len(indices), *buf.shape[1:]))
        out[:, :, :n] = buf[:, :, :n].index_select(0, indices)
        return out

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

    def preload(self, prefixes: list[list[tuple[torch.Tensor, torch.Tensor]] | None], width: int) -> None:
        """Fill the first `width` positions from kept prefixes, row b's right-aligned at [width - n_b, width) (its
        other positions stay unwritten: the attention mask hides them). Every layer of the model gets one; rows
        without a prefix (None) have nothing written."""
        first = next(p for p in prefixes if p is not None)
        B = len(prefixes)
        for layer_idx, (k0, v0) in enumerate(first):
            layer = self._new_layer(k0, v0, B, heads_dim=0)
            for b, p in enumerate(prefixes):
                if p is not None:
                    k, v = p[layer_idx]
                    layer._k[b, :, width - k.shape[1] : width] = k
                    layer._v[b, :, width - v.shape[1] : width] = v
            layer.length = width
            layer.keys, layer.values = layer._k[:, :, :width], layer._v[:, :, :width]

    def _new_layer(self, k: torch.Tensor, v: torch.Tensor, batch: int, heads_dim: int) -> InPlaceLayer:
        """A zeroed layer of `batch` rows appended to this cache, shaped and typed like keys `k` and values `v`
        (heads at dimension `heads_dim`, the head size last)."""
        layer = self.layer_class_to_replicate()
        layer._k = k.new_zeros((batch, k.shape[heads_dim], layer.capacity, k.shape[-1]))
        layer._v = v.new_zeros((batch, v.shape[heads_dim], layer.capacity, v.shape[-1]))
        layer.dtype, layer.device, layer.is_initialized = k.dtype, k.device, True
        self.layers.append(layer)
        return layer

    def place(self, rows: torch.Tensor, part: InPlaceCache, width: int, batch: int) -> None:
        """Copy a pre-filled `part` (a cache over some of this cache's `batch` rows) into rows `rows`, its positions
        right-aligned at [width - part's length, width); this cache's length becomes `width`."""
        for layer_idx, src in enumerate(part.layers):
            if layer_idx == len(self.layers):
                self._new_layer(src._k, src._v, batch, heads_dim=1)
            layer, n = self.layers[layer_idx], src.length
            layer._k[rows, :, width - n : width] = src._k[:, :, :n]
            layer._v[rows, :, width - n : width] = src._v[:, :, :n]
            layer.length = width
            layer.keys, layer.values = layer._k[:, :, :width], layer._v[:, :, :width]


def kept_length(prefix: list[tuple[torch.Tensor, torch.Tensor]] | None) -> int:
    """Positions a kept prefix (per-layer keys and values, (heads, positions, head size)) covers; 0 for None."""
    return 0 if prefix is None else prefix[0][0].shape[1]


class KeptPrefixes:
    """The KV of sequences an engine call finished, kept for the next call to continue without a new pre-fill.

    A multi-turn rollout sends each turn's whole context (prompt, sampled turns, tool output) again; the part the
    last call already computed is a prefix of it. The engine keeps, for each finished row, its token ids and the
    keys and values of those positions (everything but the last sampled token, which was never fed), and the next
    call pre-fills only what follows. Entries live for one call: what the next call does not continue is dropped,
    as are all of them when the weights change. At most `max_bytes` are kept (rows beyond it are pre-filled anew).

    Each calling thread has its own store: the async loop runs a trajectory's turns one after another on one
    worker thread, so its next turn finds exactly what its last turn kept, whatever the other trajectories did
    meanwhile. A shared store would let timing decide whether a turn continues a kept prefix or pre-fills anew,
    and the two give logits equal only to float rounding. `max_bytes` bounds each thread's store.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._lock = threading.Lock()  # the async loop may call the engine from several threads
        self._stores: dict[int, dict[tuple[int, ...], list[tuple[torch.Tensor, torch.Tensor]]]] = {}
        self._bytes: dict[int, int] = {}
        # positions taken from kept prefixes instead of a pre-fill, over the engine's life
        self.reused_tokens = 0

    def clear(self) -> None:
        with self._lock:
            self._stores, self._bytes = {}, {}

    def take(self, prompts: list[list[int]]) -> list[list[tuple[torch.Tensor, torch.Tensor]] | None]:
        """For each prompt, the longest prefix this thread's last call kept that it extends by at least one token
        (its per-layer keys and values), or None; this thread's store is emptied."""
        me = threading.get_ident()
        with self._lock:
            entries = self._stores.pop(me, {})
            self._bytes.pop(me, None)
        lengths = sorted({len(k) for k in entries}, reverse=True)
        out: list[list[tuple[torch.Tensor, torch.Tensor]] | None] = []
        for p in prompts:
            hit = None
            for n in lengths:
                if n < len(p) and (hit := entries.pop(tuple(p[:n]), None)) is not None:
                    break
            out.append(hit)
        with self._lock:
            self.reused_tokens += sum(kept_length(hit) for hit in out)
        return out

    def keep(self, cache: InPlaceCache, rows: list[int], tokens: list[list[int]], attn: torch.Tensor) -> None:
        """Keep cache rows `rows` (their token ids `tokens`, their real positions where `attn` is 1) until this
        thread's next call, within the byte budget."""
        me = threading.get_ident()
        for r, ids in zip(rows, tokens, strict=True):
            if self._bytes.get(me, 0) >= self.max_bytes:
                return
            where = attn[r].nonzero().squeeze(-1)
            if where.numel() != len(ids):
                raise RuntimeError(f"kept prefix: {where.numel()} cached positions for {len(ids)} tokens")
            kv = [(layer.keys[r][:, where], layer.values[r][:, where]) for layer in cache.layers]
            with self._lock:
                self._bytes[me] = self._bytes.get(me, 0) + sum(k.nbytes + v.nbytes for k, v in kv)
                self._stores.setdefault(me, {})[tuple(ids)] = kv
