"""The decoder's hidden states for rows that share a prompt, with the prompt computed once.

A GRPO group is `n` responses to one prompt, and the trainer's forward pass over the group repeats the prompt's
tokens `n` times: with SmolLM2's 70-token arithmetic prompts and 64-token responses, about half the update's work.
`shared_prefix_hidden` runs the distinct prompts once (right-padded, their keys and values cached), gives each row a
copy of its prompt's cache (an index: the backward sums the copies' gradients into the one prompt pass) and runs
the rows' own tokens on it. Attention is causal, so a prompt's states do not depend on what follows it: the hidden
states are the plain forward's to float rounding (tests/train/test_prefix.py), and so are the gradients.
Prefix Grouper (Liu et al., 2025) shares a GRPO group's prefix the same way.

Where it runs (`token_logprobs` asks `plan_shared_prefixes`): rows that declare a prefix length (`prefix_len`, the
trajectory's prompt) whose prefix tokens are identical to another row's in the same pass; a model whose cache keeps
every position (`full_attention_cache`: no sliding window or linear attention) and no gradient checkpointing
(transformers then drops the cache).
Everything else takes the plain forward. A pass gains when the rows sharing a prompt outnumber one, and gains the
most with long prompts and short responses; long responses leave little to save.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from tirl.core.padding import first_rows
from tirl.models.loading import cache_keyword


@dataclass(frozen=True)
class PrefixPlan:
    """Which rows share which prefix: `src[j]` is the row whose prefix is computed for distinct prefix j, and
    `inverse[b]` the j of row b; `lens[b]` is row b's prefix length."""

    src: list[int]
    inverse: torch.Tensor  # (B,) long
    lens: torch.Tensor  # (B,) long

    @property
    def shared_rows(self) -> int:
        """Rows whose prefix is not computed again."""
        return int(self.inverse.numel()) - len(self.src)


def full_attention_cache(config: object) -> bool:
    """The model's cache keeps every position of every layer (no sliding window, no linear-attention state), so a
    prefix's cache serves any continuation."""
    types = set(getattr(config, "layer_types", None) or ["full_attention"])
    return types == {"full_attention"} and not getattr(config, "use_sliding_window", False)


def plan_shared_prefixes(
    input_ids: torch.Tensor, prefix_len: Sequence[int] | torch.Tensor
) -> PrefixPlan | None:
    """The plan for (B, T) `input_ids` whose rows start with prefixes of `prefix_len` tokens, or None when no two
    rows share one (or a prefix is empty)."""
    lens = torch.as_tensor(prefix_len, dtype=torch.long).tolist()
    if len(lens) != input_ids.shape[0] or min(lens, default=0) < 1:
        return None
    src, inverse = first_rows([tuple(input_ids[b, :p].tolist()) for b, p in enumerate(lens)])
    if len(src) == len(lens):
        return None
    dev = input_ids.device
    return PrefixPlan(src, torch.tensor(inverse, device=dev), torch.tensor(lens, device=dev))


def _right_padded(rows: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, mask), (k, P): each row from position 0 on, padding after it (a padded position still attends to the
    row's real tokens, so no query is left with nothing to attend to)."""
    P = max(r.numel() for r in rows)
    ids = rows[0].new_zeros((len(rows), P))
    mask = torch.zeros((len(rows), P), dtype=torch.long, device=rows[0].device)
    for j, r in enumerate(rows):
        ids[j, : r.numel()] = r
        mask[j, : r.numel()] = 1
    return ids, mask


def _expand(cache: object, inverse: torch.Tensor) -> None:
    """Each cached layer's rows indexed by `inverse` (B,) with `index_select`, whose backward sums a prefix's copies
    in a fixed order (`DynamicCache.batch_select_indices` indexes, and that backward adds them with atomics on a
    CPU: two runs of one step differed in the last bits)."""
    for layer in cache.layers:
        layer.keys, layer.values = layer.keys.index_select(0, inverse), layer.values.index_select(0, inverse)


def _rows(states: torch.Tensor, b: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """states[b, t] for (B, T, H) `states`, whose backward sums repeated (b, t) in a fixed order."""
    B, T, H = states.shape
    return states.reshape(B * T, H).index_select(0, b * T + t)


def shared_prefix_hidden(
    decoder: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    plan: PrefixPlan,
    b_idx: torch.Tensor,
    positions: torch.Tensor,
) -> torch.Tensor:
    """(N, H) final hidden states of the right-padded rows `input_ids` (B, T) at (`b_idx`, `positions`), each (N,):
    the distinct prefixes in one pass, then every row's own tokens on its prefix's cached keys and values."""
    dev = input_ids.device
    lens = plan.lens
    pre_ids, pre_mask = _right_padded([input_ids[r, : int(lens[r])] for r in plan.src])
    P = pre_ids.shape[1]
    kw = cache_keyword(decoder)  # `cache` in newer transformers, `past_key_values` before
    pre = decoder(
        input_ids=pre_ids, attention_mask=pre_mask, position_ids=torch.arange(P, device=dev)[None, :].expand_as(pre_ids),
        use_cache=True,
    )  # fmt: skip
    cache = pre[kw]
    _expand(cache, plan.inverse)  # each row's copy of its prefix's keys and values
    ends = attention_mask.sum(dim=-1)  # (B,) each row's real length
    L = max(1, int((ends - lens).max()))
    cols = lens[:, None] + torch.arange(L, device=dev)[None, :]  # (B, L): the rows' own positions
    inside = cols < ends[:, None]
    own_ids = torch.where(inside, input_ids.gather(1, cols.clamp(max=input_ids.shape[1] - 1)), 0)
    mask = torch.cat([pre_mask[plan.inverse], inside.long()], dim=1)  # (B, P + L)
    out = decoder(input_ids=own_ids, attention_mask=mask, position_ids=cols, use_cache=True, **{kw: cache})
    in_prefix = positions < lens[b_idx]
    # index_select on flattened rows, not advanced indexing: rows sharing a prompt read its last state more than
    # once, and advanced indexing's backward adds such duplicates with atomics on a CPU, in no fixed order
    pre_rows = _rows(pre.last_hidden_state, plan.inverse[b_idx[in_prefix]], positions[in_prefix])
    own_rows = _rows(
        out.last_hidden_state, b_idx[~in_prefix], positions[~in_prefix] - lens[b_idx[~in_prefix]]
    )
    order = torch.cat([in_prefix.nonzero().squeeze(-1), (~in_prefix).nonzero().squeeze(-1)])
    return torch.cat([pre_rows, own_rows])[torch.argsort(order)]


__all__ = ["PrefixPlan", "full_attention_cache", "plan_shared_prefixes", "shared_prefix_hidden"]
