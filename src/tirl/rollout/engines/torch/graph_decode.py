"""The torch engine's decode as CUDA graphs (`rollout.torch.cuda_graphs`): a step of static shapes, captured once
per (batch-size bucket, cache capacity) and replayed.

The eager decode (`tirl.rollout.engines.torch.engine`) launches every kernel of every layer from Python at each step and grows
its attention mask with `torch.cat`; on a GPU a small model's step is bound by those launches (measured on one H100: about 1%
of what reading the weights allows). Here a step reads and writes only buffers allocated once
(`tirl.rollout.engines.torch.graph_arena`: token ids, positions, a mask over the cache's capacity set in place, each layer's
keys and values written with `index_copy_` at a position held in a device tensor, the logits). Such a step has no
host synchronisation and no Python-int shape, so `torch.cuda.graph` can capture it and a replay runs it as one
launch. It runs the policy through `tirl.rollout.engines.torch.graph_model`'s view: attention over grouped heads without copying
the cache, and under bf16 autocast a bf16 copy of the Linears' weights, so that a replay casts no weight.

A chunk's rows pad to their bucket with pad rows; when enough rows finish, the live ones move to the front and the
steps run at the next smaller bucket. Graphs, their memory pool and the arena are kept for the engine's life
(across rollout phases: a capture synchronises the device and costs more than many steps); new weights are copied
into the tensors the graphs read, in place. A step's sampled ids and log-probs reach the host in one copy, queued
before the next step is launched: the stop rules and the bookkeeping of step t run while step t+1 runs on the
device (a row that ended at t rides along in t+1, which changes no other row). Everything else is the eager
engine's own code: the pre-fill (kept prefixes included), the exact sampler outside the graph, the stop rules, the
kept prefixes of finished rows.

`capture=False` runs the same static step eagerly: the CPU tests check it against the eager engine that way. On one
H100 the capture runs and decodes 4.1x HF `generate` (docs/gpu.md). `compile_step` (`rollout.torch.compile_graph_step`) runs
the step through `torch.compile` (static shapes: one compile per (bucket, capacity), the first call of each in the
warm-up before its capture, so that the graph captures the compiled kernels); checked on a CPU, its GPU speed
unmeasured.
"""

from __future__ import annotations

import itertools
import threading
from collections import Counter
from collections.abc import Callable
from functools import partial
from typing import Any, Protocol

import torch

from tirl.core.regions import region
from tirl.rollout.engines.torch.config import GRAPH_MODES
from tirl.rollout.engines.torch.graph_arena import Arena, ArenaCache, bucket, budget_bytes, columns
from tirl.rollout.engines.torch.graph_model import RolloutWeights, rollout_weights
from tirl.rollout.engines.torch.kv_cache import InPlaceCache
from tirl.rollout.sampling import SamplingParams, sample_next
from tirl.rollout.types import Generation


class DecodeHost(Protocol):
    """What the graph decode uses of the engine it decodes for (`tirl.rollout.engines.torch.engine.TorchEngine`, which passes
    itself in): the engine's own pre-fill, token bookkeeping and kept prefixes, so that this module never imports
    the engine module that imports it."""

    model: torch.nn.Module
    device: torch.device
    max_positions: int  # 0: unknown
    compute_dtype: torch.dtype | None
    weight_version: int
    max_batch_size: int
    pad_id: int
    kept: Any  # tirl.rollout.engines.torch.kv_cache.KeptPrefixes
    _cache_kw: str

    def _prefill(
        self, prompts: list[list[int]], kept: list[Any], room: int
    ) -> tuple[InPlaceCache, torch.Tensor, torch.Tensor, torch.Tensor]: ...

    def _book(
        self,
        gens: list[Generation],
        prompts: list[list[int]],
        rows: list[int],
        active: list[int],
        sampled: Callable[[], tuple[list[int], list[float]]],
        limits: list[int],
        cache: Any,
        mask: torch.Tensor,
    ) -> list[int]: ...


# attention implementations whose math the static step's own attention (`tirl.rollout.engines.torch.graph_model`) reproduces
ATTENTION_KINDS = ("sdpa", "eager")
# runs of the step on a side stream before its capture, as torch's CUDA-graph docs ask (lazy initialisations, such
# as cuBLAS workspaces, happen there rather than inside the capture)
WARMUP_STEPS = 3

__all__ = [
    "DecodeHost",
    "GraphDecoder",
    "bucket",
    "capture_graph",
    "columns",
    "graph_decoder",
    "why_not_graphs",
]


def why_not_graphs(model: torch.nn.Module, compile: bool) -> str | None:
    """Why this model's decode cannot be captured, or None when it can (the device is asked last, so that each
    other reason can be checked on a CPU)."""
    if compile:
        return "rollout.torch.compile=true decodes through torch.compile; choose one of the two"
    attn = getattr(model.config, "_attn_implementation", None)
    if attn not in ATTENTION_KINDS:
        return f"attention implementation {attn!r}: the static step reproduces {' or '.join(ATTENTION_KINDS)}"
    if "sliding_attention" in (getattr(model.config, "layer_types", None) or ()):
        return "the model has sliding-window layers, whose masks the static step does not build"
    if any(type(p).__name__ == "DTensor" for p in model.parameters()):
        return "the model's parameters are sharded (FSDP), whose all-gathers a captured step cannot run"
    device = next(model.parameters()).device.type
    if device != "cuda":
        return f"CUDA graphs need the model on a CUDA device; it is on {device}"
    return None


def graph_decoder(
    engine: DecodeHost, mode: str, compile: bool, kv_gib: float = 0.0, compile_step: bool = False
) -> GraphDecoder | None:
    """The decoder `rollout.torch.cuda_graphs` resolves to for this engine, or None (the eager decode)."""
    if mode not in GRAPH_MODES:
        raise ValueError(f"rollout.torch.cuda_graphs={mode!r}; valid: {', '.join(GRAPH_MODES)}")
    if mode == "off":
        return None
    why = why_not_graphs(engine.model, compile)
    if why is None:
        return GraphDecoder(engine, kv_gib=kv_gib, compile_step=compile_step)
    if mode == "on":
        raise ValueError(f"rollout.torch.cuda_graphs=on: {why} (use rollout.torch.cuda_graphs=auto or off)")
    return None


def capture_graph(
    step: Callable[[], None], pool: Any, device: torch.device, amp: Callable[[], Any]
) -> tuple[Any, Any]:
    """(graph, pool): `step` warmed up on a side stream, then captured under `amp()` into a graph drawing on
    `pool` (a new one for None). The capture is thread-local: the async agent's worker and tool threads may touch
    CUDA meanwhile, which a global capture would turn into an error (or a corrupted graph) on their side."""
    pool = torch.cuda.graph_pool_handle() if pool is None else pool
    side = torch.cuda.Stream(device=device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side), amp():
        for _ in range(WARMUP_STEPS):
            step()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"), amp():
        step()
    return graph, pool


class _HostCopy:
    """A step's sampled ids and log-probs on their way to the host as one (2, n) float64 copy (ids below 2**53
    are exact), into pinned memory on CUDA so that it is queued without waiting for the device."""

    def __init__(self, rows: int, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.buf = torch.empty(
            2 * rows, dtype=torch.float64, pin_memory=self.cuda
        )  # flat: a view is contiguous

    def start(self, tok: torch.Tensor, lp: torch.Tensor) -> Callable[[], tuple[list[int], list[float]]]:
        """Queue the copy; the returned call waits for it (only for it) and gives the two lists."""
        both = torch.stack((tok.to(torch.float64), lp.to(torch.float64)))
        if self.cuda:
            both = self.buf[: both.numel()].view(both.shape).copy_(both, non_blocking=True)
            done = torch.cuda.Event()
            done.record()
        else:
            done = None

        def wait() -> tuple[list[int], list[float]]:
            if done is not None:
                done.synchronize()
            ids, lps = both.tolist()  # the step's one read on the host
            return [int(t) for t in ids], lps

        return wait


class GraphDecoder:
    """The decode of one `TorchEngine` chunk through static steps, replayed from CUDA graphs (`capture=True`) or
    run eagerly (`capture=False`, any device: the tests' check of the static-shape logic). `kv_gib`:
    `rollout.torch.graph_kv_gib`, the arena's budget (`tirl.rollout.engines.torch.graph_arena`); `compile_step`: the step
    through `torch.compile` (`rollout.torch.compile_graph_step`), with `compile_options` (the tests' backend)."""

    def __init__(
        self,
        engine: DecodeHost,
        *,
        capture: bool = True,
        kv_gib: float = 0.0,
        compile_step: bool = False,
        compile_options: dict[str, Any] | None = None,
    ) -> None:
        self.engine = engine
        self.capture = capture
        self.kv_gib = kv_gib
        # static shapes: bk and ck are Python ints, so each (bk, ck) is compiled once (past dynamo's recompile
        # limit, 8 by default, the further ones run eagerly: the same numbers)
        self._compiled: Callable[[int, int], None] | None = None
        if compile_step:
            self._compiled = torch.compile(self._static_step, dynamic=False, **(compile_options or {}))
        self._lock = threading.Lock()  # one arena: calls from several threads decode one after another
        self.arena: Arena | None = None
        self.weights: RolloutWeights | None = None
        self._graphs: dict[tuple[int, int], Any] = {}
        self._caches: dict[tuple[int, int], ArenaCache] = {}
        self._pool: Any = None
        self._addresses: tuple[int, ...] = ()
        self._version = 0  # the engine's weight version the copies were last refreshed at
        self._host: _HostCopy | None = None
        self.bucket_steps: Counter[int] = Counter()  # decode steps run at each bucket
        self.captures = 0  # graphs captured over the decoder's life

    def release(self) -> None:
        """Drop the graphs, their memory pool, the arena and the view (the engine's `close`); the next decode
        allocates and captures anew."""
        self._graphs, self._caches, self._pool, self.arena, self.weights = {}, {}, None, None, None
        self._addresses, self._host = (), None

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
            with region("tirl/decode/prefill"):  # and its copy into the arena
                cache, attn, logits, next_pos = eng._prefill(
                    [prompts[i] for i in live], [kept[i] for i in live], 0
                )
                need = attn.shape[1] + max(limits[i] for i in live)
                bk, ck = bucket(len(live), eng.max_batch_size), columns(need)
                self._prepare(cache, logits.shape[-1])
                self.arena.check(len(live), need, bk, ck)
                self._load(cache, attn, next_pos, bk, ck)
                del cache
            self._loop(prompts, limits, params, generator, gens, live, logits, attn.shape[1], ck)
        return gens

    def _prepare(self, cache: InPlaceCache, vocab: int) -> None:
        """The view and the arena, made at the first call; the bf16 copies refreshed where the trainer changed
        the weights. Graphs are dropped only where the trainer's tensors moved (new tensors, not new values)."""
        eng = self.engine
        model = eng.model
        addresses = tuple(t.data_ptr() for t in itertools.chain(model.parameters(), model.buffers()))
        # a graph reads each tensor where it was captured: new tensors (not new values) need a new view and graphs
        if self.weights is None or addresses != self._addresses:
            self.weights = rollout_weights(model, eng.compute_dtype)
            self._graphs, self._addresses = {}, addresses
        else:
            self.weights.refresh(every=eng.weight_version != self._version)
        self._version = eng.weight_version
        if self.arena is None:
            dtype = eng.compute_dtype or eng.model.get_input_embeddings().weight.dtype
            max_pos = eng.max_positions or 1 << 20
            budget = budget_bytes(self.kv_gib, eng.device)
            self.arena = Arena.allocate(cache, dtype, budget, eng.max_batch_size, columns(max_pos), vocab)
            self._host = _HostCopy(eng.max_batch_size, eng.device)

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
        """The eager engine's loop over the arena, its stop check one step behind: `rows` the generation of each
        arena row in use, `active` the rows still sampling (`index` on the device), `w` the next cache position
        written, `bk` the bucket the steps run at."""
        eng, a = self.engine, self.arena
        bk = bucket(len(rows), eng.max_batch_size)
        active = list(range(len(rows)))
        index = self._index(active)
        while active:
            every = len(active) == len(rows)
            with region("tirl/decode/sample"):
                tok, lp = sample_next(
                    logits[: len(rows)] if every else logits.index_select(0, index), params, generator
                )
                wait = self._host.start(tok, lp)
            feed = any(len(gens[rows[j]].token_ids) + 1 < limits[rows[j]] for j in active)  # unless all stop
            if feed:  # the next step runs on the device while the host books this one
                with region("tirl/decode/step"):
                    a.ids[:bk, 0].fill_(eng.pad_id).index_copy_(0, index, tok)
                    logits = self._run(bk, ck)
                w += 1
            fed = w - 1 if feed else w  # the column the launched step writes holds no finished row's token
            cache, mask = self._cache(bk, ck), a.mask_view(bk, ck)[:, :fed]
            keep = eng._book(gens, prompts, rows, active, wait, limits, cache, mask)
            if len(keep) == len(active):
                continue
            active = [active[j] for j in keep]
            if not active:
                break
            index = self._index(active)
            if bucket(len(active), eng.max_batch_size) < bk:  # the live rows to the front, a smaller bucket
                logits = logits.index_select(0, index)
                self._compact(index, w, bk, ck)
                rows, active = [rows[j] for j in active], list(range(len(active)))
                bk, index = bucket(len(rows), eng.max_batch_size), self._index(active)

    def _index(self, rows: list[int]) -> torch.Tensor:
        """`rows` on the device, uploaded from pinned memory without waiting for the device (a copy only when the
        live rows change)."""
        t, dev = torch.tensor(rows, dtype=torch.long), self.engine.device
        return t.pin_memory().to(dev, non_blocking=True) if dev.type == "cuda" else t

    def _load(
        self, cache: InPlaceCache, attn: torch.Tensor, next_pos: torch.Tensor, bk: int, ck: int
    ) -> None:
        """Copy a pre-fill (`cache`, its mask `attn` (n, cols), next positions (n, 1)) into the first rows of the
        arena's (bk, ck) view."""
        n, cols = attn.shape
        a = self.arena
        for layer, (k, v) in zip(cache.layers, a.kv(bk, ck), strict=True):
            k[:n, :, :cols] = layer.keys  # cast to the arena's dtype: one for keys and values
            v[:n, :, :cols] = layer.values
        mask = a.mask_view(bk, ck)
        mask.fill_(False)
        mask[:n, :cols] = attn.bool()
        a.pos[:bk] = 0
        a.pos[:n] = next_pos
        a.write.fill_(cols)

    def _compact(self, index: torch.Tensor, w: int, bk: int, ck: int) -> None:
        """Move rows `index` (ascending) of the (bk, ck) view to its front; only the `w` written positions are
        copied. A smaller bucket's view of the same capacity starts with the same rows."""
        a, n = self.arena, index.numel()
        for k, v in a.kv(bk, ck):
            k[:n, :, :w] = k[index, :, :w]
            v[:n, :, :w] = v[index, :, :w]
        mask = a.mask_view(bk, ck)
        mask[:n, :w] = mask[index, :w]
        a.pos[:n] = a.pos[index]

    def _run(self, bk: int, ck: int) -> torch.Tensor:
        """One decode step at bucket `bk`, capacity `ck`; returns the logits (bk, V), a view of the arena that the
        next step overwrites."""
        self._cache(bk, ck)  # the views over the arena made once, outside the step
        if self.capture:
            graph = self._graphs.get((bk, ck)) or self._capture(bk, ck)
            graph.replay()
        else:
            (self._compiled or self._static_step)(bk, ck)
        a = self.arena
        a.pos[:bk].add_(1)  # outside the step, so that running it again (warm-up, capture) changes nothing
        a.write.add_(1)
        self.bucket_steps[bk] += 1
        return a.logits[:bk]

    def _static_step(self, bk: int, ck: int) -> None:
        """The captured work: feed `ids` at `pos`, write their keys and values at `write`, leave the logits in the
        arena. Static shapes, no host synchronisation, and idempotent (the same inputs write the same values)."""
        a, eng = self.arena, self.engine
        mask = a.mask_view(bk, ck)
        mask.index_fill_(1, a.write, True)  # every row, pad rows too, attends to the token it feeds
        out = self.weights.module(
            input_ids=a.ids[:bk],
            attention_mask=mask[:, None, None, :],
            position_ids=a.pos[:bk],
            use_cache=True,
            **{eng._cache_kw: self._cache(bk, ck)},
        )  # fmt: skip  (a 4D mask is used as it is: transformers makes none, which would read a length on the host)
        a.logits[:bk].copy_(out.logits[:, -1, :])

    def _cache(self, bk: int, ck: int) -> ArenaCache:
        if (bk, ck) not in self._caches:
            self._caches[(bk, ck)] = self.arena.cache(bk, ck)
        return self._caches[(bk, ck)]

    def _capture(self, bk: int, ck: int) -> Any:
        """Capture the step at (bk, ck) into a graph drawing on the pool all of them share (they never run at
        once). The step is idempotent, so the warm-up runs change nothing."""
        step = partial(self._compiled or self._static_step, bk, ck)
        graph, self._pool = capture_graph(step, self._pool, self.arena.ids.device, self._amp)
        self._graphs[(bk, ck)] = graph
        self.captures += 1
        return graph

    def _amp(self) -> torch.autocast:
        """The engine's precision with autocast's weight cache off: a captured cast must be part of the graph, not
        a cached tensor freed when the call's autocast ends (the Linears' weights are bf16 already)."""
        dt = self.engine.compute_dtype
        return torch.autocast(
            self.arena.ids.device.type,
            dtype=dt or torch.bfloat16,
            enabled=dt is not None,
            cache_enabled=False,
        )
