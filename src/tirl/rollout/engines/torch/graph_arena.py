"""The buffers the static decode steps read and write (`tirl.rollout.engines.torch.graph_decode`), sized once from a memory
budget (`rollout.torch.graph_kv_gib`), and the shapes a step runs at.

A step runs at a bucket of B rows (a power of two up to `max_batch_size`) and a capacity of C cache positions
(`columns`: a multiple of a quarter of its octave, so a chunk attends over at most ~25% more positions than it
needs, with four capacities per doubling to capture graphs for). Each layer's keys and values live in one flat
buffer of `slots` (row, position) pairs, viewed as (B, heads, C, head size) for any B x C <= slots: a bucket of
fewer rows may hold longer rows in the same memory, and since a chunk keeps its C, row r of a smaller bucket's
view is row r of the larger one's (compaction moves rows within one view). The buffers are allocated once, at
the first call, and kept: a graph holds their addresses, so they never grow and never move. A chunk whose B x C
exceeds `slots` is refused with the numbers (`Arena.check`).

The budget: `rollout.torch.graph_kv_gib`, 0 = a quarter of the GPU's memory (as `micro_batch_tokens: auto` gives
the update's activations a quarter; the weights, gradients, optimizer state and a bf16 copy share the rest),
1 GiB on a CPU; never more than `max_batch_size` rows of the model's longest context need. For Qwen3-0.6B (28
layers, 8 key/value heads of 128, bf16: 112 KiB a position) a quarter of an 80 GB GPU holds ~180k positions: 64
rows of 2,816 positions, or 256 rows of 704.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

GIB = 1024**3
GPU_SHARE = 0.25
CPU_BUDGET_GIB = 1.0  # the CPU runs the static step uncaptured only (the tests' check of its logic)
MIN_COLUMNS = 128  # the smallest capacity: short chunks share one set of graphs


def bucket(n: int, max_batch_size: int) -> int:
    """The batch size `n` live rows run at: the next power of two, at most `max_batch_size`."""
    return min(1 << (n - 1).bit_length(), max_batch_size)


def columns(need: int) -> int:
    """The cache capacity a chunk needing `need` positions runs at: `need` rounded up to a multiple of an eighth
    of the power of two at or above it (a quarter of its octave: four capacities per doubling, less than 25% more
    than `need`), at least `MIN_COLUMNS`."""
    step = 1 << max(0, (need - 1).bit_length() - 3)
    return max(MIN_COLUMNS, -(-need // step) * step)


def budget_bytes(gib: float, device: torch.device) -> int:
    """`rollout.torch.graph_kv_gib` in bytes; 0 = by the device (module docstring)."""
    if gib > 0:
        return int(gib * GIB)
    if device.type == "cuda":
        return int(GPU_SHARE * torch.cuda.get_device_properties(device).total_memory)
    return int(CPU_BUDGET_GIB * GIB)


class ArenaLayer(DynamicLayer):
    """One layer's cache over a view of the arena: a step writes its token at the device-held position `write`
    (cast to the arena's one dtype: Qwen3's key norm leaves keys in fp32 under autocast) and attention reads every
    column (the mask hides the unwritten ones)."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, write: torch.Tensor) -> None:
        super().__init__()
        self.keys, self.values, self.write = keys, values, write
        self.dtype, self.device, self.is_initialized = keys.dtype, keys.device, True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        self.keys.index_copy_(2, self.write, key_states.to(self.keys.dtype))
        self.values.index_copy_(2, self.write, value_states.to(self.values.dtype))
        return self.keys, self.values


class ArenaCache(DynamicCache):
    """The model's cache argument for one (bucket, capacity): `ArenaLayer`s over the arena's views."""

    def __init__(self, layers: list[ArenaLayer]) -> None:
        super().__init__()
        self.layers = layers


@dataclass
class Arena:
    """The static buffers (module docstring): `slots` (row, position) pairs of keys, values and mask; ids,
    positions and logits for `rows` rows."""

    keys: list[torch.Tensor]  # per layer, flat: slots x heads x head size
    values: list[torch.Tensor]
    shapes: list[tuple[int, int, int, int]]  # per layer: key heads, key size, value heads, value size
    mask: torch.Tensor  # (slots,) bool: the cache positions a row attends to
    ids: torch.Tensor  # (rows, 1) the tokens a step feeds
    pos: torch.Tensor  # (rows, 1) their positions
    logits: torch.Tensor  # (rows, V) float32, the step's output
    write: torch.Tensor  # (1,) the cache position a step writes
    slots: int
    slot_bytes: int

    @classmethod
    def allocate(
        cls, cache: DynamicCache, dtype: torch.dtype, budget: int, rows: int, max_cols: int, vocab: int
    ) -> Arena:
        """Buffers shaped like the pre-filled `cache`'s layers in `dtype`, as many slots as `budget` bytes hold
        (at most `rows` x `max_cols`), zeros: a masked position must hold a finite number, as attention multiplies
        it by a zero weight."""
        dev = cache.layers[0].keys.device
        shapes = [(*layer.keys.shape[1:2], layer.keys.shape[-1], *layer.values.shape[1:2], layer.values.shape[-1])
                  for layer in cache.layers]  # fmt: skip
        size = torch.empty((), dtype=dtype).element_size()
        slot_bytes = sum(hk * dk + hv * dv for hk, dk, hv, dv in shapes) * size + 1  # + the mask's byte
        slots = min(budget // slot_bytes, rows * max_cols)
        return cls(
            keys=[torch.zeros(slots * hk * dk, dtype=dtype, device=dev) for hk, dk, _, _ in shapes],
            values=[torch.zeros(slots * hv * dv, dtype=dtype, device=dev) for _, _, hv, dv in shapes],
            shapes=shapes,
            mask=torch.zeros(slots, dtype=torch.bool, device=dev),
            ids=torch.zeros((rows, 1), dtype=torch.long, device=dev),
            pos=torch.zeros((rows, 1), dtype=torch.long, device=dev),
            logits=torch.zeros((rows, vocab), dtype=torch.float32, device=dev),
            write=torch.zeros((1,), dtype=torch.long, device=dev),
            slots=slots,
            slot_bytes=slot_bytes,
        )

    def check(self, n: int, need: int, bk: int, ck: int) -> None:
        """Refuse a chunk of `n` rows needing `need` positions, run at `bk` x `ck`, that the arena cannot hold."""
        if bk * ck > self.slots:
            raise ValueError(
                f"rollout.torch.cuda_graphs: {n} rows needing {need} cache positions run at {bk} rows x {ck} "
                f"positions = {bk * ck} KV slots, but the arena holds {self.slots} "
                f"({self.slots * self.slot_bytes / GIB:.2f} GiB at {self.slot_bytes} bytes a slot); lower "
                "rollout.torch.max_batch_size or the token budgets, or raise rollout.torch.graph_kv_gib"
            )

    def kv(self, bk: int, ck: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each layer's (keys, values) viewed as (bk, heads, ck, head size)."""
        return [
            (k[: bk * hk * ck * dk].view(bk, hk, ck, dk), v[: bk * hv * ck * dv].view(bk, hv, ck, dv))
            for k, v, (hk, dk, hv, dv) in zip(self.keys, self.values, self.shapes, strict=True)
        ]

    def mask_view(self, bk: int, ck: int) -> torch.Tensor:
        return self.mask[: bk * ck].view(bk, ck)

    def cache(self, bk: int, ck: int) -> ArenaCache:
        return ArenaCache([ArenaLayer(k, v, self.write) for k, v in self.kv(bk, ck)])
