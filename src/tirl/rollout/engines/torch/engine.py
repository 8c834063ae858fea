"""Batched sampling with a KV cache over any Hugging Face causal LM: token ids in, token ids and log-probs out.

Each call takes a batch of prompts (token ids of any lengths), left-pads them, pre-fills the cache once (identical
prompts, a GRPO group's, once for all of them) and decodes step by step, so a step costs one forward pass over one
new token per sequence. The cache is written in place
(`tirl.rollout.engines.torch.kv_cache`), never copied as it grows. Finished sequences are dropped from
the batch (their cache rows too), so a long tail of unfinished rollouts runs at its own size.

Log-probs are those of the sampled token under the temperature-scaled distribution, before top-p/top-k truncation:
the same quantity the trainer recomputes (`tirl.train.logprobs.token_logprobs` with the same temperature).

`compute_dtype=torch.bfloat16` (`rollout.dtype: bfloat16`) decodes under bf16 autocast over the fp32 weights: the
casts are made once per batch (autocast's weight cache lives for the whole decode; not under `cuda_graphs`, whose
steps read a bf16 copy of their own) and the KV cache is bf16. Where
the hardware multiplies bf16 natively (AVX512-BF16/AMX, GPUs) decode is faster; the log-probs it reports differ
from the trainer's fp32 ones, so the engine then declares `same_numerics=False` and RL corrects for them.

On a CPU the Linears run on weights packed for oneDNN once per weight version (`tirl.rollout.engines.torch.packed`, `pack`):
always in bf16, and in fp32 on AMD CPUs for models at least 512 wide, where oneDNN's fp32 kernels ran SmolLM2's
decode 1.6-1.8x as fast as PyTorch's MKL path (AVX2 there) on an AVX-512 EPYC. fp32 packed products are fp32
numbers in another summation order, within float rounding of the trainer's.

A multi-turn rollout sends each turn's whole context again. The engine keeps the keys and values of the rows a call
finished (`KeptPrefixes`, up to `keep_prefix_mib`), and a prompt that extends one of them pre-fills only its new
tokens (the tool output and what follows): on the demo the second turn's pre-fill shrinks from ~80 tokens a row
to ~15. The kept prefix holds the values a full pre-fill would compute, to float rounding (tested). Kept entries
last one call and are dropped when the weights change.

`cuda_graphs` (`rollout.torch.cuda_graphs`, off by default) decodes through `tirl.rollout.engines.torch.graph_decode` instead:
steps of static shapes over buffers allocated once (within `graph_kv_gib`), captured as CUDA graphs per
batch-size bucket and replayed.

Not here: continuous batching across calls and paged attention; use the vLLM engine for those.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import Any

import torch

from tirl.core.padding import first_rows, least_padding_parts
from tirl.core.regions import region
from tirl.models.loading import cache_keyword
from tirl.rollout.capabilities import EngineCapabilities
from tirl.rollout.engines.torch.graph_decode import graph_decoder
from tirl.rollout.engines.torch.kv_cache import InPlaceCache, KeptPrefixes, kept_length
from tirl.rollout.engines.torch.packed import PACK_MODES, PackedLinears, packing_available, packing_pays
from tirl.rollout.sampling import SamplingParams, per_prompt_budgets, sample_next
from tirl.rollout.types import Generation

__all__ = ["Generation", "TorchEngine", "cache_keyword", "unique_rows"]

# Finished rows leave the cache when the live ones are at most this share of its rows. Dropping rows copies every
# layer's buffer (87 ms for 256 rows of the demo model, against 20 ms for a decode step), and in a batch's tail rows
# finish at nearly every step; until then a finished row costs one wasted row of compute per step.
COMPACT_AT = 0.75


def unique_rows(prompts: Sequence[Sequence[int]], kept: Sequence[Any]) -> tuple[list[int], list[int]]:
    """(src, inverse) of `first_rows`: the rows to pre-fill (the first row of each distinct prompt without a kept
    prefix, and every row with one) and, for each row, the position in `src` of the row whose pre-fill it shares."""
    return first_rows([tuple(p) if k is None else None for p, k in zip(prompts, kept, strict=True)])


def _as_lists(tok: torch.Tensor, lp: torch.Tensor) -> tuple[list[int], list[float]]:
    """A step's sampled ids and log-probs read on the host."""
    return tok.tolist(), lp.tolist()


class TorchEngine:
    """Generation over an in-process torch model (CPU or GPU); implements `tirl.rollout.engines.base.Engine`.

    It samples from the very module the trainer updates, so `sync_weights` only bumps the weight version.
    Per-request `seeds` are not supported (one `generator` drives the whole batch): passing them is an error.
    Each training process under torchrun builds its own, over its own (sharded) module.
    """

    capabilities = EngineCapabilities(
        name="torch", weight_sync="shared", logprobs="full", per_request_seeds=False, multi_process=True,
        batches_requests=False,
    )  # fmt: skip

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        eos_ids: Sequence[int],
        pad_id: int,
        stop_ids: Sequence[int] = (),
        max_batch_size: int = 256,
        compute_dtype: torch.dtype | None = None,
        keep_prefix_mib: int = 1024,
        compile: bool = False,
        pack: str = "auto",
        cuda_graphs: str = "off",
        graph_kv_gib: float = 0.0,
        compile_graph_step: bool = False,
    ) -> None:
        if not eos_ids:
            raise ValueError("at least one EOS id is needed to know when a turn ends")
        self.model = model
        self.eos_ids = set(eos_ids)
        self.stop_ids = set(stop_ids)
        self.pad_id = pad_id
        self.max_batch_size = max_batch_size
        self.weight_version = 0
        self._cache_kw = cache_keyword(model)
        if compute_dtype not in (None, torch.bfloat16):
            raise ValueError(
                f"the torch engine decodes in fp32 or under bfloat16 autocast, not {compute_dtype}"
            )
        self.compute_dtype = compute_dtype  # None: the weights' own dtype
        self.packed = self._packer(pack, compile)
        # decode steps only (pre-fills vary too much in shape to pay for recompiles); the module is shared
        self._step = torch.compile(model, dynamic=True) if compile else model
        self.kept = KeptPrefixes(keep_prefix_mib * 2**20)  # 0: every call pre-fills its prompts whole
        # None: the eager decode
        self.graphs = graph_decoder(self, cuda_graphs, compile, graph_kv_gib, compile_graph_step)
        if compute_dtype is not None:
            self.capabilities = self.capabilities.with_precision(compute_dtype, None)

    def _packer(self, pack: str, compile: bool) -> PackedLinears | None:
        """The oneDNN packs the Linears run on (`rollout.torch.pack`: auto = on a CPU where it pays), or None."""
        if pack not in PACK_MODES:
            raise ValueError(f"rollout.torch.pack={pack!r}; valid: {', '.join(PACK_MODES)}")
        weights = next(self.model.parameters())
        dtype = self.compute_dtype or weights.dtype
        usable = weights.device.type == "cpu" and packing_available(dtype)
        if pack == "on":
            if compile:
                raise ValueError(
                    "rollout.torch.pack=on with rollout.torch.compile=true: Inductor cannot compile oneDNN's packed Linears; "
                    "choose one (rollout.torch.pack=auto leaves a compiled engine unpacked)"
                )
            if not usable:
                raise ValueError(
                    f"rollout.torch.pack=on: oneDNN packed {dtype} Linears need a CPU and a PyTorch with oneDNN; the "
                    f"model is on {weights.device.type} (use rollout.torch.pack=auto)"
                )
            return PackedLinears(self.model, dtype)
        if pack == "off" or compile or not usable or not packing_pays(dtype, self.model.config.hidden_size):
            return None
        return PackedLinears(self.model, dtype)

    def sync_weights(self, model: torch.nn.Module) -> None:
        """The policy changed. This engine holds the trainer's own module, so nothing is copied here (the CUDA-graph
        decode refreshes its bf16 copies of the weights, in place, at its next call)."""
        if model is not self.model:
            raise ValueError("TorchEngine samples from the trainer's own module; it was given another one")
        self.weight_version += 1
        self.kept.clear()  # computed with the old weights

    @contextlib.contextmanager
    def awake(self) -> Iterator[None]:
        """A phase of rollouts (RL's): what the engine keeps from call to call
        (packed weights, kept prefixes) is dropped after it, so the update that follows has that memory. CUDA graphs
        and their arena are kept (sized once within `graph_kv_gib`): capturing them again each step would cost
        more than the memory."""
        try:
            yield
        finally:
            self.kept.clear()
            if self.packed is not None:
                self.packed.clear()

    def check(self, tokenizer: Any) -> None:
        """Every id the tokenizer, the stop rules and the padding can produce has a row in the model's embedding."""
        rows = self.model.get_input_embeddings().num_embeddings
        ids = {"the tokenizer's vocabulary": len(tokenizer) - 1, "pad_id": self.pad_id}
        ids.update({f"stop/EOS id {i}": i for i in self.eos_ids | self.stop_ids})
        for what, top in ids.items():
            if top >= rows:
                raise ValueError(
                    f"{what} reaches id {top} but the model's embedding has {rows} rows: the tokenizer does not "
                    "belong to this model (load both from the same directory)"
                )

    def close(self) -> None:
        if self.graphs is not None:
            self.graphs.release()

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def max_positions(self) -> int:
        return int(getattr(self.model.config, "max_position_embeddings", 0) or 0)

    @torch.no_grad()
    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        *,
        max_new_tokens: Sequence[int] | int | None = None,
        generator: torch.Generator | None = None,
        seeds: Sequence[int] | None = None,
    ) -> list[Generation]:
        """Sample one continuation per prompt; `max_new_tokens` may differ per prompt (token budgets)."""
        if seeds is not None:
            raise ValueError("TorchEngine takes one `generator` for the batch, not per-request seeds")
        n = len(prompts)
        limits = per_prompt_budgets(n, params, max_new_tokens)
        if any(len(p) == 0 for p in prompts):
            raise ValueError("empty prompt: a generation needs at least one token of context")
        results: list[Generation | None] = [None] * n
        kept = self.kept.take([list(p) for p in prompts])
        # Similar lengths together: less padding in each chunk.
        order = sorted(range(n), key=lambda i: len(prompts[i]))
        dt = self.compute_dtype
        # the graph decode's steps read its own bf16 copy of the weights: a cache of autocast's casts would only
        # serve the pre-fill, and would hold a second bf16 copy of every Linear through the decode
        amp = {"dtype": dt or torch.bfloat16, "enabled": dt is not None, "cache_enabled": self.graphs is None}
        for s in range(0, n, self.max_batch_size):
            idx = order[s : s + self.max_batch_size]
            packed = self.packed.active() if self.packed else contextlib.nullcontext()
            with torch.autocast(self.device.type, **amp), packed:
                outs = self._generate_chunk(
                    [list(prompts[i]) for i in idx],
                    [limits[i] for i in idx],
                    params,
                    generator,
                    [kept[i] for i in idx],
                )
            for i, g in zip(idx, outs, strict=True):
                results[i] = g
        return results  # type: ignore[return-value]

    def _generate_chunk(
        self,
        prompts: list[list[int]],
        limits: list[int],
        params: SamplingParams,
        generator: torch.Generator | None,
        kept: list[Any],
    ) -> list[Generation]:
        if self.graphs is not None:
            return self.graphs.decode(prompts, limits, params, generator, kept)
        dev = self.device
        B = len(prompts)
        gens = [Generation([], [], "length", self.weight_version) for _ in range(B)]
        live = [i for i in range(B) if limits[i] > 0]
        if not live:
            return gens
        with region("tirl/decode/prefill"):
            cache, attn, logits, next_pos = self._prefill(
                [prompts[i] for i in live], [kept[i] for i in live], max(limits[i] for i in live)
            )
        rows = live  # the generation each cache row belongs to; `active`: the cache rows still sampling
        active = list(range(len(rows)))
        while active:
            every = len(active) == len(rows)
            with region("tirl/decode/sample"):
                tok, lp = sample_next(logits if every else logits[active], params, generator)
            sampled = partial(_as_lists, tok, lp)  # read on the host inside the booking
            keep = self._book(gens, prompts, rows, active, sampled, limits, cache, attn)
            active, tok = [active[j] for j in keep], tok[keep] if len(keep) < len(tok) else tok
            if not active:
                break
            if len(active) <= COMPACT_AT * len(rows):  # drop the finished rows from the cache
                k = torch.as_tensor(active, device=dev)
                cache.batch_select_indices(k)
                attn, next_pos, rows = attn[k], next_pos[k], [rows[j] for j in active]
                active = list(range(len(rows)))
            elif len(active) < len(rows):  # finished rows ride along on a pad token until the next compaction
                tok = torch.full((len(rows),), self.pad_id, dtype=tok.dtype, device=dev).index_copy_(
                    0, torch.as_tensor(active, device=dev), tok
                )
            attn = torch.cat([attn, attn.new_ones((len(rows), 1))], dim=1)
            with region("tirl/decode/step"):
                out = self._step(
                    input_ids=tok[:, None],
                    attention_mask=attn,
                    position_ids=next_pos,
                    use_cache=True,
                    **{self._cache_kw: cache},
                )
                logits = out.logits[:, -1, :].float()
            next_pos = next_pos + 1
        return gens

    def _prefill(
        self, prompts: list[list[int]], kept: list[Any], room: int
    ) -> tuple[InPlaceCache, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Pre-fill every row; returns the cache, with `room` positions left for new tokens, the attention mask (its
        columns the cache's positions), the last logits (B, V) and each row's next position (B, 1).

        Identical prompts without a kept prefix are pre-filled once and their cache rows copied: a GRPO group's
        first turn is `n` rollouts of one prompt, so RL's first pre-fill computes one row in `n`."""
        src, inverse = unique_rows(prompts, kept)
        if len(src) == len(prompts):
            return self._prefill_rows(prompts, kept, room)
        cache, attn, logits, next_pos = self._prefill_rows(
            [prompts[i] for i in src], [kept[i] for i in src], room
        )
        idx = torch.as_tensor(inverse, device=self.device)
        cache.batch_select_indices(idx)  # each row's copy of its prompt's keys and values
        return cache, attn[idx], logits[idx], next_pos[idx]

    def _prefill_rows(
        self, prompts: list[list[int]], kept: list[Any], room: int
    ) -> tuple[InPlaceCache, torch.Tensor, torch.Tensor, torch.Tensor]:
        """`_prefill` of distinct rows (after each one's kept prefix, if any) in passes of rows with similar numbers
        of tokens to compute (`least_padding_parts`: one left-padded pass over a batch whose tool outputs run from 5
        to 90 tokens computes mostly padding)."""
        dev = self.device
        todo = [len(p) - kept_length(k) for p, k in zip(prompts, kept, strict=True)]
        parts = least_padding_parts(todo, max_tokens=1 << 40)  # no memory bound beyond one whole pass's
        outs = []
        for part in parts:
            ids, attn, pos, width = self._prefill_inputs([prompts[i] for i in part], [kept[i] for i in part])
            ids, attn, pos = ids.to(dev), attn.to(dev), pos.to(dev)
            cache = InPlaceCache(attn.shape[1] + (room if len(parts) == 1 else 0))
            if width:
                cache.preload([kept[i] for i in part], width)
            out = self.model(
                input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=True, logits_to_keep=1,
                **{self._cache_kw: cache},
            )  # fmt: skip
            outs.append((part, cache, attn, out.logits[:, -1, :].float(), pos[:, -1:] + 1))
        if len(parts) == 1:
            return outs[0][1:]
        cols = max(o[2].shape[1] for o in outs)  # each part's block right-aligned in one cache
        cache = InPlaceCache(cols + room)
        attn = torch.zeros((len(prompts), cols), dtype=torch.long, device=dev)
        logits = torch.empty((len(prompts), outs[0][3].shape[-1]), device=dev)
        next_pos = torch.empty((len(prompts), 1), dtype=torch.long, device=dev)
        for part, part_cache, part_attn, part_logits, part_next in outs:
            rows = torch.as_tensor(part, device=dev)
            cache.place(rows, part_cache, cols, len(prompts))
            attn[rows, cols - part_attn.shape[1] :] = part_attn
            logits[rows], next_pos[rows] = part_logits, part_next
        return cache, attn, logits, next_pos

    def _prefill_inputs(
        self, prompts: list[list[int]], kept: list[Any]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
        """(ids, attention mask, position ids, width) of the pre-fill. Without kept prefixes: the prompts
        left-padded, width 0. With them: each row's kept positions right-aligned in the first `width` columns of the
        mask (they are already in the cache) and its remaining tokens left-padded after them; positions count the
        row's real tokens, so a row reads as it would after a full pre-fill."""
        done = [kept_length(k) for k in kept]
        rest = [p[n:] for p, n in zip(prompts, done, strict=True)]
        ids, attn = self._left_pad(rest)
        width = max(done)
        if not width:
            return ids, attn, (attn.cumsum(-1) - 1).clamp(min=0), 0
        head = torch.zeros((len(prompts), width), dtype=torch.long)
        for b, n in enumerate(done):
            head[b, width - n :] = 1
        pos = (attn.cumsum(-1) - 1).clamp(min=0) + torch.tensor(done)[:, None]
        return ids, torch.cat([head, attn], dim=1), pos, width

    def _left_pad(self, prompts: list[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """(ids, attention mask), both (B, L): prompts right-aligned so every row's next token is at the end."""
        B, L = len(prompts), max(len(p) for p in prompts)
        ids = torch.full((B, L), self.pad_id, dtype=torch.long)
        attn = torch.zeros((B, L), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, L - len(p) :] = torch.as_tensor(list(p), dtype=torch.long)
            attn[i, L - len(p) :] = 1
        return ids, attn

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
    ) -> list[int]:
        """A decode step's booking on the host, for the eager and the graph decode: the sampled ids and log-probs
        (`sampled()`: the step's read) added to the `active` cache rows (`rows[j]`: row j's generation), then the
        prefixes of the rows that finished kept from `cache` (`mask`: its columns the cache's positions that hold
        their tokens). Returns the positions in `active` of the rows that go on."""
        with region("tirl/decode/host"):
            keep = self._append(gens, [rows[j] for j in active], *sampled(), limits)
            if len(keep) < len(active) and self.kept.max_bytes:
                done = sorted({active[j] for j in set(range(len(active))) - set(keep)})
                tokens = [prompts[rows[j]] + gens[rows[j]].token_ids[:-1] for j in done]
                self.kept.keep(cache, done, tokens, mask)
        return keep

    def _append(
        self, gens: list[Generation], live: list[int], toks: list[int], lps: list[float], limits: list[int]
    ) -> list[int]:
        """Add one sampled token to each live row; returns the positions in `live` of the rows that go on."""
        keep: list[int] = []
        for j, i in enumerate(live):
            g = gens[i]
            g.token_ids.append(toks[j])
            g.logprobs.append(lps[j])
            if toks[j] in self.eos_ids:
                g.finish_reason = "eos"
            elif toks[j] in self.stop_ids:
                g.finish_reason = "stop"
            elif len(g.token_ids) >= limits[i]:
                g.finish_reason = "length"
            else:
                keep.append(j)
        return keep
