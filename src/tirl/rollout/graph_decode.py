"""The torch engine's decode as CUDA graphs (`rollout.torch.cuda_graphs`): a step of static shapes, captured once
per batch-size bucket and replayed.

The eager decode (`tirl.rollout.engine`) launches every kernel of every layer from Python at each step and grows
its attention mask with `torch.cat`; on a GPU a small model's step is bound by those launches (measured on one H100: about 1%
of what reading the weights allows). Here a step reads and writes only buffers allocated once (`_Arena`): token
ids (B, 1), position ids (B, 1), an attention mask over the cache's full capacity set in place, each layer's keys
and values (B, heads, C, head size) written with `index_copy_` at a position held in a device tensor, and the
logits (B, V). Such a step has no host synchronisation and no Python-int shape, so `torch.cuda.graph` can capture
it and a replay runs it as one launch.

B is a bucket, a power of two up to `max_batch_size`: a chunk's rows pad to their bucket with pad rows, and when
enough rows finish the live ones move to the front and the steps run at the next smaller bucket. C is a power of
two covering the pre-fill's columns plus the longest budget; attention reads all C, the unwritten ones masked out.
Everything else is the eager engine's own code: the pre-fill (kept prefixes included), the exact sampler on the
step's logits outside the graph, the stop rules, the kept prefixes of finished rows.

`capture=False` runs the same static step eagerly: the CPU tests check it against the eager engine that way. The
capture itself and its speed have not run on a GPU yet.
"""

from __future__ import annotations

import itertools
import threading
from collections import Counter
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from tirl.rollout.config import GRAPH_MODES
from tirl.rollout.kv_cache import InPlaceCache
from tirl.rollout.sampling import SamplingParams, sample_next
from tirl.rollout.types import Generation

if TYPE_CHECKING:
    from tirl.rollout.engine import TorchEngine

# attention implementations whose mask the static step builds: sdpa takes a boolean one, eager an additive one
MASK_KINDS = ("sdpa", "eager")
MIN_COLUMNS = 128  # the smallest cache capacity: short chunks share one set of graphs
# runs of the step on a side stream before its capture, as torch's CUDA-graph docs ask (lazy initialisations, such
# as cuBLAS workspaces, happen there rather than inside the capture)
WARMUP_STEPS = 3


def bucket(n: int, max_batch_size: int) -> int:
    """The batch size `n` live rows run at: the next power of two, at most `max_batch_size`."""
    return min(1 << (n - 1).bit_length(), max_batch_size)


def columns(need: int) -> int:
    """The cache capacity a chunk needing `need` positions runs at: a power of two, at least `MIN_COLUMNS`."""
    return max(MIN_COLUMNS, 1 << (need - 1).bit_length())


def why_not_graphs(model: torch.nn.Module, compile: bool) -> str | None:
    """Why this model's decode cannot be captured, or None when it can (the device is asked last, so that each
    other reason can be checked on a CPU)."""
    if compile:
        return "rollout.torch.compile=true decodes through torch.compile; choose one of the two"
    attn = getattr(model.config, "_attn_implementation", None)
    if attn not in MASK_KINDS:
        return (
            f"attention implementation {attn!r}: the static step builds masks for {' or '.join(MASK_KINDS)}"
        )
    if "sliding_attention" in (getattr(model.config, "layer_types", None) or ()):
        return "the model has sliding-window layers, whose masks the static step does not build"
    if any(type(p).__name__ == "DTensor" for p in model.parameters()):
        return "the model's parameters are sharded (FSDP), whose all-gathers a captured step cannot run"
    device = next(model.parameters()).device.type
    if device != "cuda":
        return f"CUDA graphs need the model on a CUDA device; it is on {device}"
    return None


def graph_decoder(engine: TorchEngine, mode: str, compile: bool) -> GraphDecoder | None:
    """The decoder `rollout.torch.cuda_graphs` resolves to for this engine, or None (the eager decode)."""
    if mode not in GRAPH_MODES:
        raise ValueError(f"rollout.torch.cuda_graphs={mode!r}; valid: {', '.join(GRAPH_MODES)}")
    if mode == "off":
        return None
    why = why_not_graphs(engine.model, compile)
    if why is None:
        return GraphDecoder(engine)
    if mode == "on":
        raise ValueError(f"rollout.torch.cuda_graphs=on: {why} (use rollout.torch.cuda_graphs=auto or off)")
    return None


class _ArenaLayer(DynamicLayer):
    """One layer's cache over a view of the arena: a step writes its token at the device-held position `write`
    and attention reads every column (the mask hides the unwritten ones)."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, write: torch.Tensor) -> None:
        super().__init__()
        self.keys, self.values, self.write = keys, values, write
        self.dtype, self.device, self.is_initialized = keys.dtype, keys.device, True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        self.keys.index_copy_(2, self.write, key_states)
        self.values.index_copy_(2, self.write, value_states)
        return self.keys, self.values


class _ArenaCache(DynamicCache):
    """The model's cache argument for one (bucket, capacity): `_ArenaLayer`s over the arena's views."""

    def __init__(self, layers: list[_ArenaLayer]) -> None:
        super().__init__()
        self.layers = layers


@dataclass
class _Arena:
    """The static buffers every step reads and writes; a graph of bucket B and capacity C uses the views
    [:B] (and [:, :, :C] / [:, :C]), so buckets share one allocation."""

    keys: list[torch.Tensor]  # per layer (R, heads, C_max, head size)
    values: list[torch.Tensor]
    mask: torch.Tensor  # (R, C_max) bool: the cache positions a row attends to
    ids: torch.Tensor  # (R, 1) the tokens a step feeds
    pos: torch.Tensor  # (R, 1) their positions
    logits: torch.Tensor  # (R, V) float32, the step's output
    write: torch.Tensor  # (1,) the cache position a step writes

    @classmethod
    def like(cls, cache: InPlaceCache, rows: int, cols: int, vocab: int) -> _Arena:
        """Buffers for `rows` rows and `cols` positions, typed like the pre-filled `cache` (zeros: a masked
        position must hold a finite number, as attention multiplies it by a zero weight)."""
        k0 = cache.layers[0].keys
        dev = k0.device

        def kv(t: torch.Tensor) -> torch.Tensor:
            return t.new_zeros((rows, t.shape[1], cols, t.shape[-1]))

        return cls(
            keys=[kv(layer.keys) for layer in cache.layers],
            values=[kv(layer.values) for layer in cache.layers],
            mask=torch.zeros((rows, cols), dtype=torch.bool, device=dev),
            ids=torch.zeros((rows, 1), dtype=torch.long, device=dev),
            pos=torch.zeros((rows, 1), dtype=torch.long, device=dev),
            logits=torch.zeros((rows, vocab), dtype=torch.float32, device=dev),
            write=torch.zeros((1,), dtype=torch.long, device=dev),
        )

    def fits(self, cache: InPlaceCache, rows: int, cols: int) -> bool:
        k0 = cache.layers[0].keys
        return (
            len(self.keys) == len(cache.layers) and self.keys[0].dtype == k0.dtype
            and self.mask.shape[0] >= rows and self.mask.shape[1] >= cols
        )  # fmt: skip


class GraphDecoder:
    """The decode of one `TorchEngine` chunk through static steps, replayed from CUDA graphs (`capture=True`) or
    run eagerly (`capture=False`, any device: the tests' check of the static-shape logic)."""

    def __init__(self, engine: TorchEngine, *, capture: bool = True) -> None:
        self.engine = engine
        self.capture = capture
        self.mask_kind = getattr(engine.model.config, "_attn_implementation", "sdpa")
        self._lock = threading.Lock()  # one arena: calls from several threads decode one after another
        self.arena: _Arena | None = None
        self._graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self._caches: dict[tuple[int, int], _ArenaCache] = {}
        self._pool: Any = None
        self._params: tuple[int, ...] = ()
        self.bucket_steps: Counter[int] = Counter()  # decode steps run at each bucket
        self.captures = 0  # graphs captured over the decoder's life

    def release(self) -> None:
        """Drop the graphs, their memory pool and the arena (the engine's `awake` does after a rollout phase, so
        the update has that memory); the next decode allocates and captures anew."""
        self._graphs, self._caches, self._pool, self.arena = {}, {}, None, None

    def decode(
        self,
        prompts: list[list[int]],
        limits: list[int],
        params: SamplingParams,
        generator: torch.Generator | None,
        kept: list[Any],
    ) -> list[Generation]:
        """`TorchEngine._generate_chunk`'s contract: one generation per prompt."""
        eng = self.engine
        gens = [Generation([], [], "length", eng.weight_version) for _ in prompts]
        live = [i for i in range(len(prompts)) if limits[i] > 0]
        if not live:
            return gens
        with self._lock:
            cache, attn, logits, next_pos = eng._prefill(
                [prompts[i] for i in live], [kept[i] for i in live], 0
            )
            ck = columns(attn.shape[1] + max(limits[i] for i in live))
            self._load(cache, attn, next_pos, logits.shape[-1], bucket(len(live), eng.max_batch_size), ck)
            del cache
            self._loop(prompts, limits, params, generator, gens, live, logits, attn.shape[1], ck)
        return gens

    def _loop(
        self,
        prompts: list[list[int]],
        limits: list[int],
        params: SamplingParams,
        generator: torch.Generator | None,
        gens: list[Generation],
        rows: list[int],
        logits: torch.Tensor,
        w: int,
        ck: int,
    ) -> None:
        """The eager engine's loop over the arena: `rows` the generation of each arena row in use, `active` the
        rows still sampling, `w` the next cache position written, `bk` the bucket the steps run at."""
        eng, a = self.engine, self.arena
        bk = bucket(len(rows), eng.max_batch_size)
        active = list(range(len(rows)))
        while active:
            every = len(active) == len(rows)
            tok, lp = sample_next(logits[: len(rows)] if every else logits[active], params, generator)
            keep = eng._append(gens, [rows[j] for j in active], tok.tolist(), lp.tolist(), limits)
            if len(keep) < len(active) and eng.kept.max_bytes:
                done = sorted({active[j] for j in set(range(len(active))) - set(keep)})
                tokens = [prompts[rows[j]] + gens[rows[j]].token_ids[:-1] for j in done]
                eng.kept.keep(self._cache(bk, ck), done, tokens, a.mask[:bk, :w])
            active, tok = [active[j] for j in keep], tok[keep] if len(keep) < len(tok) else tok
            if not active:
                break
            if bucket(len(active), eng.max_batch_size) < bk:  # the live rows to the front, a smaller bucket
                self._compact(active, w)
                rows, active = [rows[j] for j in active], list(range(len(active)))
                bk = bucket(len(rows), eng.max_batch_size)
            ids = a.ids[:bk, 0].fill_(eng.pad_id)  # finished and pad rows ride along on a pad token
            ids.index_copy_(0, torch.as_tensor(active, device=ids.device), tok)
            logits = self._run(bk, ck)
            w += 1

    def _load(
        self, cache: InPlaceCache, attn: torch.Tensor, next_pos: torch.Tensor, vocab: int, bk: int, ck: int
    ) -> None:
        """Copy a pre-fill (`cache`, its mask `attn` (n, cols), next positions (n, 1)) into the arena's first rows,
        (re)allocating it where it is too small and dropping graphs whose parameters moved."""
        n, cols = attn.shape
        model = self.engine.model
        params = tuple(t.data_ptr() for t in itertools.chain(model.parameters(), model.buffers()))
        if params != self._params:  # a graph reads the weights at the addresses it was captured with
            self._graphs, self._params = {}, params
        if self.arena is None or not self.arena.fits(cache, bk, ck):
            old = (0, 0) if self.arena is None else self.arena.mask.shape
            self.release()
            self.arena = _Arena.like(cache, max(bk, old[0]), max(ck, old[1]), vocab)
        a = self.arena
        for layer, k, v in zip(cache.layers, a.keys, a.values, strict=True):
            k[:n, :, :cols] = layer.keys
            v[:n, :, :cols] = layer.values
        a.mask[:bk, :ck] = False
        a.mask[:n, :cols] = attn.bool()
        a.pos[:bk] = 0
        a.pos[:n] = next_pos
        a.write.fill_(cols)

    def _compact(self, active: list[int], w: int) -> None:
        """Move arena rows `active` (ascending) to the front; only the `w` written positions are copied."""
        a = self.arena
        k = torch.as_tensor(active, device=a.ids.device)
        n = len(active)
        for t in (*a.keys, *a.values):
            t[:n, :, :w] = t[k, :, :w]
        a.mask[:n, :w] = a.mask[k, :w]
        a.pos[:n] = a.pos[k]

    def _run(self, bk: int, ck: int) -> torch.Tensor:
        """One decode step at bucket `bk`, capacity `ck`; returns the logits (bk, V), a view of the arena that the
        next step overwrites."""
        self._cache(bk, ck)  # the views over the arena made once, outside the step
        if self.capture:
            graph = self._graphs.get((bk, ck)) or self._capture(bk, ck)
            graph.replay()
        else:
            self._static_step(bk, ck)
        a = self.arena
        a.pos[:bk].add_(1)  # outside the step, so that running it again (warm-up, capture) changes nothing
        a.write.add_(1)
        self.bucket_steps[bk] += 1
        return a.logits[:bk]

    def _static_step(self, bk: int, ck: int) -> None:
        """The captured work: feed `ids` at `pos`, write their keys and values at `write`, leave the logits in the
        arena. Static shapes, no host synchronisation, and idempotent (the same inputs write the same values)."""
        a, eng = self.arena, self.engine
        mask = a.mask[:bk, :ck]
        mask.index_fill_(1, a.write, True)  # every row, pad rows too, attends to the token it feeds
        out = eng.model(
            input_ids=a.ids[:bk], attention_mask=self._mask4d(mask), position_ids=a.pos[:bk], use_cache=True,
            **{eng._cache_kw: self._cache(bk, ck)},
        )  # fmt: skip
        a.logits[:bk].copy_(out.logits[:, -1, :])

    def _mask4d(self, mask: torch.Tensor) -> torch.Tensor:
        """(B, 1, 1, C) as the attention implementation takes it; a 4D mask is used as it is (transformers makes
        none of its own, which would read the cache's length as a Python int)."""
        if self.mask_kind == "sdpa":
            return mask[:, None, None, :]
        dtype = self.engine.model.get_input_embeddings().weight.dtype  # the dtype transformers' own mask has
        add = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(
            ~mask, torch.finfo(dtype).min
        )
        return add[:, None, None, :]

    def _cache(self, bk: int, ck: int) -> _ArenaCache:
        if (bk, ck) not in self._caches:
            a = self.arena
            layers = [
                _ArenaLayer(k[:bk, :, :ck], v[:bk, :, :ck], a.write)
                for k, v in zip(a.keys, a.values, strict=True)
            ]
            self._caches[(bk, ck)] = _ArenaCache(layers)
        return self._caches[(bk, ck)]

    def _capture(self, bk: int, ck: int) -> torch.cuda.CUDAGraph:
        """Warm the step up on a side stream, then capture it into a graph drawing on the pool all buckets share
        (they never run at once). The step is idempotent, so the warm-up runs change nothing."""
        dev = self.arena.ids.device
        step = partial(self._static_step, bk, ck)
        side = torch.cuda.Stream(device=dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side), self._autocast():
            for _ in range(WARMUP_STEPS):
                step()
        torch.cuda.current_stream(dev).wait_stream(side)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool), self._autocast():
            step()
        self._graphs[(bk, ck)] = graph
        self.captures += 1
        return graph

    def _autocast(self) -> torch.autocast:
        """The engine's precision with autocast's weight cache off: a captured cast must be part of the graph, not
        a cached tensor freed when the call's autocast ends."""
        dt = self.engine.compute_dtype
        return torch.autocast("cuda", dtype=dt or torch.bfloat16, enabled=dt is not None, cache_enabled=False)
