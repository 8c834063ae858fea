"""One mini-batch of the policy update, split into micro-batches whose gradients accumulate.

Every micro-batch's loss is divided by the counts of the whole mini-batch (trained tokens for `token-mean`,
sequences for the sequence modes), summed over processes with `tirl.train.dist.all_reduce_sum`, so the accumulated
gradient is the mini-batch's gradient whatever the split and however many processes share the batch. Log-probs are
computed on trained positions only, in chunks (`tirl.train.logprobs`).

`token_mean="micro"` (verl's "token-mean", `rl.token_mean`) instead takes each micro-batch's own token mean and
weights it by the micro-batch's share of the mini-batch's sequences: tokens of a short micro-batch weigh more, and
the result depends on where the micro-batches split.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import torch

from tirl.algorithms import aggregate, kl_penalty
from tirl.train import dist
from tirl.train.batch import TokenBatch, micro_batches_by_length, slice_rows
from tirl.train.dist import all_reduce_sum
from tirl.train.fsdp import MicroBatchPasses, idle_forward, matched_parts
from tirl.train.logprobs import DEFAULT_CHUNK_TOKENS, token_logprobs


@dataclass
class LossSpec:
    """What the loss of an update needs besides tensors: the policy loss and its keyword hyperparameters."""

    loss_fn: Any
    clip_low: float
    clip_high: float
    clip_c: float
    agg: str
    norm_len: int
    temperature: float
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    entropy_coef: float = 0.0
    micro_batch_size: int = 0  # sequences per micro-batch; 0 = the whole mini-batch
    micro_batch_tokens: int = 0  # padded tokens per micro-batch; 0 = no budget
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS
    autocast: torch.dtype | None = (
        None  # model.autocast: forward/backward in this dtype, fp32 weights and log-softmax
    )
    token_mean: str = "exact"  # token-mean over the mini-batch (exact) or verl's per micro-batch (micro)

    @classmethod
    def for_rl(
        cls, cfg: Any, loss_fn: Any, norm_len: int, temperature: float, autocast: torch.dtype | None
    ) -> LossSpec:
        """The spec an `RLConfig` (`cfg`) asks for, with the trainer's resolved loss, length and temperature."""
        return cls(
            loss_fn, clip_low=cfg.clip_low, clip_high=cfg.clip_high, clip_c=cfg.clip_c, agg=cfg.loss_agg,
            norm_len=norm_len, temperature=temperature, kl_coef=cfg.kl_coef, kl_estimator=cfg.kl_estimator,
            entropy_coef=cfg.entropy_coef, micro_batch_size=cfg.micro_batch_size,
            micro_batch_tokens=cfg.micro_batch_tokens, token_mean=cfg.token_mean, autocast=autocast,
        )  # fmt: skip


def global_counts(loss_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(trained tokens, sequences with a trained token) of a mini-batch, summed over all processes."""
    counts = torch.stack([loss_mask.sum(), (loss_mask.sum(dim=-1) > 0).sum().to(loss_mask.dtype)]).float()
    tokens, seqs = all_reduce_sum(counts)
    return tokens, seqs


def micro_norm(norm: dict[str, Any], mask: torch.Tensor, rows: int, total_rows: float) -> dict[str, Any]:
    """verl's token-mean normalizer for one micro-batch: its own trained tokens, scaled so that the loss is its
    token mean times its share (rows / total_rows) of the mini-batch's sequences."""
    tokens = mask.sum().float().clamp(min=1.0)
    return {**norm, "num_tokens": tokens * total_rows / rows}


def accumulate_gradients(
    policy: torch.nn.Module,
    mini: TokenBatch,
    old_logp: torch.Tensor | None,
    ref_logp: torch.Tensor | None,
    spec: LossSpec,
) -> dict[str, float]:
    """Forward and backward over `mini`'s micro-batches (gradients accumulate in `policy`); returns its stats.

    mini: the mini-batch, with `advantages` (B, T) in `extra`; old_logp / ref_logp: (B, T) or None (None old
    log-probs: on-policy, the detached log-probs of this very forward pass). `loss/total` and `loss/pg` are the
    mini-batch's values; the other stats are token-weighted means over the micro-batches.
    """
    num_tokens, num_seqs = global_counts(mini.loss_mask)
    passes = MicroBatchPasses(
        policy, mini, max_seqs=spec.micro_batch_size, max_tokens=spec.micro_batch_tokens
    )  # idle passes included where a sharded model needs them
    sums: Counter[str] = Counter()  # token-weighted sums of the loss statistics
    totals: Counter[str] = Counter()
    norm = {"norm_len": spec.norm_len, "num_tokens": num_tokens, "num_seqs": num_seqs}
    per_micro = spec.token_mean == "micro" and spec.agg == "token-mean"
    total_rows = float(all_reduce_sum(torch.tensor(float(mini.input_ids.shape[0])))) if per_micro else 0.0
    for rows, micro in passes:
        mask = micro.loss_mask
        if per_micro:
            norm = micro_norm(norm, mask, len(rows), total_rows)
        loss, stats = _micro_loss(policy, micro, rows, old_logp, ref_logp, spec, norm, totals)
        if loss.requires_grad:  # a micro-batch without trained tokens has no graph and nothing to add
            loss.backward()
        totals["loss/total"] += float(loss.detach())
        weight = float(mask.sum())
        sums.update({k: v * weight for k, v in stats.items() if k != "loss/pg"})
    # Across ranks: the losses are already divided by global counts, so they add up; the statistics are
    # token-weighted means over the whole mini-batch.
    reduced = dist.sum_floats({**{f"sum:{k}": v for k, v in sums.items()}, **totals})
    total_tokens = max(float(num_tokens), 1.0)
    out = {k[4:]: v / total_tokens for k, v in reduced.items() if k.startswith("sum:")}
    out.update({k: v for k, v in reduced.items() if not k.startswith("sum:")})
    out["loss/micro_batches"] = float(len(passes))
    return out


@torch.no_grad()
def no_grad_logprobs(
    model: torch.nn.Module,
    batch: TokenBatch,
    *,
    max_seqs: int,
    max_tokens: int,
    temperature: float,
    autocast: torch.dtype | None,
) -> torch.Tensor:
    """(B, T) log-probs of `batch`'s trained tokens (0 elsewhere) without a graph: the old policy's or the KL
    reference's. Passes of at most `max_seqs` rows and `max_tokens` padded tokens, shortest rows first under a token
    budget (`micro_batches_by_length`: little padding); a sharded model runs as many passes on every rank."""
    out = torch.zeros(batch.input_ids.shape, dtype=torch.float32, device=batch.input_ids.device)
    parts = micro_batches_by_length(
        batch.attention_mask.sum(dim=-1).tolist(), max_seqs=max_seqs, max_tokens=max_tokens
    )
    for rows in matched_parts(model, parts):
        if rows is None:
            idle_forward(model, batch.input_ids.device)
            continue
        part = slice_rows(batch, rows)
        lp, _ = token_logprobs(
            model, part.input_ids, part.attention_mask, temperature=temperature, loss_mask=part.loss_mask,
            autocast=autocast,
        )  # fmt: skip
        out[rows, : lp.shape[1]] = lp
    return out


def _micro_loss(
    policy: torch.nn.Module,
    micro: TokenBatch,
    rows: Any,
    old_logp: torch.Tensor | None,
    ref_logp: torch.Tensor | None,
    spec: LossSpec,
    norm: dict[str, Any],
    totals: Counter[str],
) -> tuple[torch.Tensor, dict[str, float]]:
    """One micro-batch's forward and loss (policy loss + KL - entropy bonus); adds its terms to `totals`."""
    width = micro.input_ids.shape[1]
    mask = micro.loss_mask
    logp, ent = token_logprobs(
        policy,
        micro.input_ids,
        micro.attention_mask,
        temperature=spec.temperature,
        with_entropy=spec.entropy_coef > 0,
        loss_mask=mask,
        chunk_tokens=spec.chunk_tokens,
        autocast=spec.autocast,
    )
    old = logp.detach() if old_logp is None else old_logp[rows, :width]
    loss, stats = spec.loss_fn(
        logp,
        old,
        micro.extra["advantages"],
        mask,
        clip_low=spec.clip_low,
        clip_high=spec.clip_high,
        clip_c=spec.clip_c,
        agg=spec.agg,
        **norm,
    )
    totals["loss/pg"] += float(loss.detach())
    if ref_logp is not None:
        kl = aggregate(
            kl_penalty(logp, ref_logp[rows, :width], estimator=spec.kl_estimator), mask, spec.agg, **norm
        )
        loss = loss + spec.kl_coef * kl
        totals["loss/kl"] += float(kl.detach())
    if ent is not None:
        entropy = aggregate(ent, mask, spec.agg, **norm)
        loss = loss - spec.entropy_coef * entropy
        totals["loss/entropy"] += float(entropy.detach())
    return loss, stats
