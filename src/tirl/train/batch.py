"""Collation: token-id lists with explicit loss masks become right-padded (B, T) tensors for the trainers."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from tirl.core.padding import first_rows, least_padding_parts, shared_prefix_parts


@dataclass
class TokenBatch:
    """input_ids, attention_mask and loss_mask are (B, T); loss_mask[b, t] = 1 where token t is trained.

    `extra` holds per-token float tensors aligned with input_ids (e.g. rollout log-probs, advantages).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    extra: dict[str, torch.Tensor]
    # (B,) each row's prompt length, or None: rows with the same prompt may share its forward (tirl.train.prefix)
    prefix_len: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.prefix_len is not None and self.prefix_len.shape != self.input_ids.shape[:1]:
            raise ValueError(
                f"prefix_len has shape {tuple(self.prefix_len.shape)} for {self.input_ids.shape[0]} rows"
            )

    def to(self, device: torch.device | str) -> TokenBatch:
        return TokenBatch(
            self.input_ids.to(device),
            self.attention_mask.to(device),
            self.loss_mask.to(device),
            {k: v.to(device) for k, v in self.extra.items()},
            None if self.prefix_len is None else self.prefix_len.to(device),
        )

    def prefix_keys(self) -> list[int] | None:
        """Per row, a number shared by exactly the rows with the same prompt tokens (None without prompts)."""
        if self.prefix_len is None:
            return None
        ids = self.input_ids.tolist()
        return first_rows([tuple(ids[b][:p]) for b, p in enumerate(self.prefix_len.tolist())])[1]

    @property
    def num_tokens(self) -> int:
        return int(self.loss_mask.sum().item())


def collate(
    ids: Sequence[Sequence[int]],
    masks: Sequence[Sequence[int]],
    *,
    pad_id: int,
    extra: dict[str, Sequence[Sequence[float]]] | None = None,
) -> TokenBatch:
    """Right-pad sequences; padding gets attention 0 and loss 0 (never inferred from pad/EOS ids)."""
    if len(ids) != len(masks):
        raise ValueError(f"{len(ids)} id lists but {len(masks)} masks")
    B, T = len(ids), max(len(x) for x in ids)
    input_ids = torch.full((B, T), pad_id, dtype=torch.long)
    attn = torch.zeros((B, T), dtype=torch.long)
    loss = torch.zeros((B, T), dtype=torch.float32)
    out_extra = {k: torch.zeros((B, T), dtype=torch.float32) for k in (extra or {})}
    for b, (x, m) in enumerate(zip(ids, masks, strict=True)):
        if len(x) != len(m):
            raise ValueError(f"sequence {b}: {len(x)} ids but {len(m)} mask entries")
        n = len(x)
        input_ids[b, :n] = torch.as_tensor(list(x), dtype=torch.long)
        attn[b, :n] = 1
        loss[b, :n] = torch.as_tensor(list(m), dtype=torch.float32)
        for k, v in (extra or {}).items():
            if len(v[b]) != n:
                raise ValueError(f"sequence {b}: extra {k!r} has {len(v[b])} entries for {n} ids")
            out_extra[k][b, :n] = torch.as_tensor(list(v[b]), dtype=torch.float32)
    return TokenBatch(input_ids, attn, loss, out_extra)


def micro_batches(lengths: Sequence[int], *, max_seqs: int = 0, max_tokens: int = 0) -> list[list[int]]:
    """Split positions 0..len(lengths)-1, in order, into micro-batches of at most `max_seqs` sequences and at most
    `max_tokens` padded tokens (count x longest length: what a forward pass costs); 0 = no limit. A sequence longer
    than `max_tokens` gets a micro-batch of its own rather than an error: the budget is for memory, not validity."""
    if max_seqs < 0 or max_tokens < 0:
        raise ValueError(f"micro-batch limits must be >= 0 (0 = none), got {max_seqs}, {max_tokens}")
    out: list[list[int]] = []
    cur: list[int] = []
    longest = 0
    for i, n in enumerate(lengths):
        grown = max(longest, n)
        full = (max_seqs and len(cur) >= max_seqs) or (max_tokens and (len(cur) + 1) * grown > max_tokens)
        if cur and full:
            out.append(cur)
            cur, grown = [], n
        cur.append(i)
        longest = grown
    if cur:
        out.append(cur)
    return out


def micro_batches_by_length(
    lengths: Sequence[int],
    *,
    max_seqs: int = 0,
    max_tokens: int = 0,
    prefixes: tuple[Sequence[int], Sequence[int]] | None = None,
) -> list[list[int]]:
    """`micro_batches` of the rows sorted by length, each part's rows back in their own order, when the only bound
    is a token budget (as verl's dynamic batch size rearranges by length): the parts are cut where they waste the
    least padding for the passes they add (`least_padding_split`), which on the demo's SFT batches of 32 takes
    the padded tokens from 2.2x the real ones to 1.1x with about 3 passes. `prefixes` (each row's prompt key and
    length, `TokenBatch.prefix_keys`): a prompt's rows are kept together and its tokens counted once per pass
    (`shared_prefix_parts`). With `max_seqs` (verl's fixed
    micro-batch size) or no budget the rows are split in order, as verl splits them."""
    if max_seqs or not max_tokens:
        return micro_batches(lengths, max_seqs=max_seqs, max_tokens=max_tokens)
    if prefixes is not None:  # (keys, prefix lengths): rows sharing a prompt share its pass
        keys, plen = prefixes
        own = [n - p for n, p in zip(lengths, plen, strict=True)]
        return shared_prefix_parts(own, keys, plen, max_tokens)
    return least_padding_parts(lengths, max_tokens)


def slice_rows(batch: TokenBatch, rows: torch.Tensor | Sequence[int]) -> TokenBatch:
    """The given rows of `batch`, cut to their longest real length (right padding beyond it is dropped)."""
    rows = torch.as_tensor(rows, dtype=torch.long, device=batch.input_ids.device)
    width = max(1, int(batch.attention_mask[rows].sum(dim=-1).max().item())) if rows.numel() else 1
    return TokenBatch(
        batch.input_ids[rows, :width],
        batch.attention_mask[rows, :width],
        batch.loss_mask[rows, :width],
        {k: v[rows, :width] for k, v in batch.extra.items()},
        None if batch.prefix_len is None else batch.prefix_len[rows],
    )
