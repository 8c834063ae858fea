"""Batched sampling with a KV cache over any Hugging Face causal LM: token ids in, token ids and log-probs out.

Each call takes a batch of prompts (token ids of any lengths), left-pads them, pre-fills the cache once and decodes
step by step, so a step costs one forward pass over one new token per sequence. The cache is written in place
(`tirl.rollout.kv_cache`), never copied as it grows. Finished sequences are dropped from
the batch (their cache rows too), so a long tail of unfinished rollouts runs at its own size.

Log-probs are those of the sampled token under the temperature-scaled distribution, before top-p/top-k truncation:
the same quantity the trainer recomputes (`tirl.train.logprobs.token_logprobs` with the same temperature).

`compute_dtype=torch.bfloat16` (`rollout.dtype: bfloat16`) decodes under bf16 autocast over the fp32 weights: the
casts are made once per batch (autocast's weight cache lives for the whole decode) and the KV cache is bf16. Where
the hardware multiplies bf16 natively (AVX512-BF16/AMX, GPUs) decode is faster; the log-probs it reports differ
from the trainer's fp32 ones, so the engine then declares `same_numerics=False` and RL recomputes and corrects them.

Not here: continuous batching across calls and paged attention; use the vLLM engine for those.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import torch

from tirl.rollout.capabilities import EngineCapabilities
from tirl.rollout.kv_cache import InPlaceCache
from tirl.rollout.sampling import SamplingParams, per_prompt_budgets, sample_next
from tirl.rollout.types import Generation

__all__ = ["Generation", "TorchEngine", "cache_keyword"]


def cache_keyword(model: torch.nn.Module) -> str:
    """The forward argument that takes the KV cache: `cache` in newer transformers (which warns on every call given
    the older name), `past_key_values` before; a PEFT model is asked through the model it wraps."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    params = inspect.signature(type(inner).forward).parameters
    return "cache" if "cache" in params else "past_key_values"


class TorchEngine:
    """Generation over an in-process torch model (CPU or GPU); implements `tirl.rollout.types.Engine`.

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
        if compute_dtype is not None:
            self.capabilities = self.capabilities.with_precision(compute_dtype, None)

    def sync_weights(self, model: torch.nn.Module) -> None:
        """The policy changed. This engine holds the trainer's own module, so nothing is copied."""
        if model is not self.model:
            raise ValueError("TorchEngine samples from the trainer's own module; it was given another one")
        self.weight_version += 1

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
        pass

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

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
        # Similar lengths together: less padding in each chunk.
        order = sorted(range(n), key=lambda i: len(prompts[i]))
        dt = self.compute_dtype
        for s in range(0, n, self.max_batch_size):
            idx = order[s : s + self.max_batch_size]
            with torch.autocast(self.device.type, dtype=dt or torch.bfloat16, enabled=dt is not None):
                outs = self._generate_chunk(
                    [prompts[i] for i in idx], [limits[i] for i in idx], params, generator
                )
            for i, g in zip(idx, outs, strict=True):
                results[i] = g
        return results  # type: ignore[return-value]

    def _generate_chunk(
        self,
        prompts: list[Sequence[int]],
        limits: list[int],
        params: SamplingParams,
        generator: torch.Generator | None,
    ) -> list[Generation]:
        dev = self.device
        B = len(prompts)
        gens = [Generation([], [], "length", self.weight_version) for _ in range(B)]
        live = [i for i in range(B) if limits[i] > 0]
        if not live:
            return gens
        ids, attn = self._left_pad(prompts)
        ids, attn = ids[live].to(dev), attn[live].to(dev)
        pos = (attn.cumsum(-1) - 1).clamp(min=0)  # (B, L)
        cache = InPlaceCache(ids.shape[1] + max(limits[i] for i in live))
        out = self.model(
            input_ids=ids,
            attention_mask=attn,
            position_ids=pos,
            use_cache=True,
            logits_to_keep=1,
            **{self._cache_kw: cache},
        )
        logits = out.logits[:, -1, :].float()  # (B, V)
        next_pos = pos[:, -1:] + 1  # (B, 1)
        while live:
            tok, lp = sample_next(logits, params, generator)
            keep = self._append(gens, live, tok.tolist(), lp.tolist(), limits)
            if not keep:
                break
            if len(keep) < len(live):
                k = torch.as_tensor(keep, device=dev)
                cache.batch_select_indices(k)
                attn, next_pos, tok = attn[k], next_pos[k], tok[k]
                live = [live[j] for j in keep]
            attn = torch.cat([attn, attn.new_ones((len(live), 1))], dim=1)
            out = self.model(
                input_ids=tok[:, None],
                attention_mask=attn,
                position_ids=next_pos,
                use_cache=True,
                **{self._cache_kw: cache},
            )
            logits = out.logits[:, -1, :].float()
            next_pos = next_pos + 1
        return gens

    def _left_pad(self, prompts: list[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """(ids, attention mask), both (B, L): prompts right-aligned so every row's next token is at the end."""
        B, L = len(prompts), max(len(p) for p in prompts)
        ids = torch.full((B, L), self.pad_id, dtype=torch.long)
        attn = torch.zeros((B, L), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, L - len(p) :] = torch.as_tensor(list(p), dtype=torch.long)
            attn[i, L - len(p) :] = 1
        return ids, attn

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
