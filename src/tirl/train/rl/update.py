"""One mini-batch of the policy update, split into micro-batches whose gradients accumulate.

Every micro-batch's loss is divided by the counts of the whole mini-batch (trained tokens for `token-mean`,
sequences for the sequence modes), summed over processes with `tirl.train.dist.all_reduce_sum`, so the accumulated
gradient is the mini-batch's gradient whatever the split and however many processes share the batch. Log-probs are
computed on trained positions only, in chunks (`tirl.train.logprobs`).

`token_mean="micro"` (verl's "token-mean", `rl.token_mean`) instead takes each micro-batch's own token mean and
weights it by the micro-batch's share of the mini-batch's sequences: tokens of a short micro-batch weigh more, and
the result depends on where the micro-batches split.

An on-policy update (one over the whole batch) takes its old log-probs from its own forward pass, detached. When
the engine's log-probs are not the trainer's (another process, bf16 on either side), that same pass also gives the
rollout correction (`LossSpec.correction`: each micro-batch's advantages times the detached weight of
`tirl.algorithms.rollout_correction`, computed from its rows alone), so no separate no-grad pass is needed; the
detached log-probs are written to `seen` for the mismatch metrics.
"""

from __future__ import annotations

import functools
from collections import Counter
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

import torch

from tirl.algorithms import aggregate, kl_penalty
from tirl.core.regions import region
from tirl.train import dist
from tirl.train.batch import TokenBatch, slice_rows
from tirl.train.compiled import CompiledLayers
from tirl.train.dist import all_reduce_sum
from tirl.train.fsdp import MicroBatchPasses, batch_parts, idle_forward, matched_parts
from tirl.train.logprobs import (
    DEFAULT_CHUNK_TOKENS,
    autocast_context,
    backward_outside_autocast,
    token_logprobs,
)
from tirl.train.rl.config import RLConfig
from tirl.train.rl.correction import RolloutCorrection

RL_KEY = "rl"  # a LossSpec field's metadata key: the setting under `rl.` that `LossSpec.for_rl` reads into it


def from_rl(key: str, default: Any = MISSING) -> Any:
    """A `LossSpec` field that `LossSpec.for_rl` reads from `rl.<key>`: a setting every loss shares is carried from
    the config by this one line; `default`, if given, is its value in a spec built by hand."""
    return field(default=default, metadata={RL_KEY: key})


@dataclass
class LossSpec:
    """What the loss of an update needs besides tensors: the policy loss and its keyword hyperparameters (`hyper`:
    the loss's own, from its `rl.loss.*` options), and the settings every term shares (the `from_rl` fields)."""

    loss_fn: Any
    hyper: dict[str, Any]
    agg: str = from_rl("loss.agg")
    norm_len: int  # rl.loss.norm_len resolved: 0 there is the response budget
    temperature: float
    kl_coef: float = from_rl("kl.coef", 0.0)
    kl_estimator: str = from_rl("kl.estimator", "k3")
    entropy_coef: float = from_rl("entropy_coef", 0.0)
    # sequences per micro-batch; 0 = the whole mini-batch
    micro_batch_size: int = from_rl("micro_batch_size", 0)
    # padded tokens per micro-batch; 0 = no budget
    micro_batch_tokens: int = from_rl("micro_batch_tokens", 0)
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS
    # model.autocast: forward/backward in this dtype, fp32 weights and log-softmax
    autocast: torch.dtype | None = None
    # token-mean over the mini-batch (exact) or verl's per micro-batch (micro)
    token_mean: str = from_rl("loss.token_mean", "exact")
    # rows with one prompt share its forward pass (tirl.train.prefix)
    share_prefix: bool = from_rl("share_prefix", False)
    # on-policy rollout correction in the update's own pass (module docstring), with the engine's sampling
    # log-probs in the batch's extra["rollout_logp"]; None: none
    correction: RolloutCorrection | None = None
    # model.compile_layers: the policy's compiled decoder layers (tirl.train.compiled); None: eager
    compiled: CompiledLayers | None = None

    @classmethod
    def for_rl(
        cls,
        cfg: RLConfig,
        loss_fn: Any,
        norm_len: int,
        temperature: float,
        autocast: torch.dtype | None,
        compiled: CompiledLayers | None = None,
    ) -> LossSpec:
        """The spec `cfg` asks for: every `from_rl` field read from its key, with the trainer's resolved loss,
        length and temperature."""
        shared = {f.name: rl_value(cfg, f.metadata[RL_KEY]) for f in fields(cls) if RL_KEY in f.metadata}
        return cls(
            loss_fn,
            hyper=cfg.loss.hyperparameters(),
            norm_len=norm_len,
            temperature=temperature,
            autocast=autocast,
            compiled=compiled,
            **shared,
        )


def rl_value(cfg: RLConfig, key: str) -> Any:
    """The value of `rl.<key>` (a dotted key under `rl.`, as `loss.agg`) in `cfg`."""
    return functools.reduce(getattr, key.split("."), cfg)


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
    seen: torch.Tensor | None = None,
) -> dict[str, float]:
    """Forward and backward over `mini`'s micro-batches (gradients accumulate in `policy`); returns its stats.

    mini: the mini-batch, with `advantages` (B, T) in `extra`; old_logp / ref_logp: (B, T) or None (None old
    log-probs: on-policy, the detached log-probs of this very forward pass). `seen` (B, T), if given, receives those
    detached log-probs. `loss/total` and `loss/pg` are the mini-batch's values; the other stats are token-weighted
    means over the micro-batches.
    """
    if spec.correction is not None and (old_logp is not None or "rollout_logp" not in mini.extra):
        raise ValueError(
            "the in-pass rollout correction needs an on-policy update (no old log-probs) and the engine's "
            "log-probs in extra['rollout_logp']"
        )
    num_tokens, num_seqs = global_counts(mini.loss_mask)
    # idle passes included where a sharded model needs them
    passes = MicroBatchPasses(
        policy,
        mini,
        max_seqs=spec.micro_batch_size,
        max_tokens=spec.micro_batch_tokens,
        share_prefix=spec.share_prefix,
    )
    sums: Counter[str] = Counter()  # token-weighted sums of the loss statistics
    totals: Counter[str] = Counter()
    norm = {"norm_len": spec.norm_len, "num_tokens": num_tokens, "num_seqs": num_seqs}
    per_micro = spec.token_mean == "micro" and spec.agg == "token-mean"
    total_rows = float(all_reduce_sum(torch.tensor(float(mini.input_ids.shape[0])))) if per_micro else 0.0
    # One autocast region over the micro-batches: autocast keeps its bf16 copies of the weights until the outermost
    # region exits, so each weight is cast once per mini-batch rather than once per pass.
    with autocast_context(mini.input_ids.device, spec.autocast):
        for rows, micro in passes:
            mask = micro.loss_mask
            if per_micro:
                norm = micro_norm(norm, mask, len(rows), total_rows)
            with region("tirl/update/forward"):
                loss, stats = _micro_loss(policy, micro, rows, old_logp, ref_logp, spec, norm, totals, seen)
            if loss.requires_grad:  # a micro-batch without trained tokens has no graph and nothing to add
                with region("tirl/update/backward"):
                    backward_outside_autocast(loss)
            totals["loss/total"] += float(loss.detach())
            weight = float(mask.sum())
            sums.update({k: v * weight for k, v in stats.items() if k != "loss/pg"})
    out = _over_ranks(sums, totals, num_tokens)
    out["loss/micro_batches"] = float(len(passes))
    return out


def _over_ranks(sums: Counter[str], totals: Counter[str], num_tokens: torch.Tensor) -> dict[str, float]:
    """A mini-batch's stats over all ranks: the losses (`totals`) are already divided by global counts, so they add
    up; the statistics (`sums`, token-weighted) become token-weighted means over the whole mini-batch."""
    reduced = dist.sum_floats({**{f"sum:{k}": v for k, v in sums.items()}, **totals})
    total_tokens = max(float(num_tokens), 1.0)
    out = {k[4:]: v / total_tokens for k, v in reduced.items() if k.startswith("sum:")}
    out.update({k: v for k, v in reduced.items() if not k.startswith("sum:")})
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
    share_prefix: bool = False,
) -> torch.Tensor:
    """(B, T) log-probs of `batch`'s trained tokens (0 elsewhere) without a graph: the old policy's or the KL
    reference's. Passes of at most `max_seqs` rows and `max_tokens` padded tokens, shortest rows first under a token
    budget (`micro_batches_by_length`: little padding; `share_prefix`: a prompt's rows together, sharing its pass);
    a sharded model runs as many passes on every rank."""
    out = torch.zeros(batch.input_ids.shape, dtype=torch.float32, device=batch.input_ids.device)
    parts = batch_parts(model, batch, max_seqs=max_seqs, max_tokens=max_tokens, share_prefix=share_prefix)
    for rows in matched_parts(model, parts):
        if rows is None:
            idle_forward(model, batch.input_ids.device)
            continue
        part = slice_rows(batch, rows)
        lp, _ = token_logprobs(
            model,
            part.input_ids,
            part.attention_mask,
            temperature=temperature,
            loss_mask=part.loss_mask,
            autocast=autocast,
            prefix_len=part.prefix_len if share_prefix else None,
        )
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
    seen: torch.Tensor | None = None,
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
        prefix_len=micro.prefix_len if spec.share_prefix else None,
        compiled=spec.compiled,
    )
    old = logp.detach() if old_logp is None else old_logp[rows, :width]
    if seen is not None:
        seen[rows, :width] = old
    adv = micro.extra["advantages"]
    if spec.correction is not None:  # the surrogate is homogeneous in A: w weights each token's loss
        adv = spec.correction.weighted(adv, old, micro.extra["rollout_logp"], mask)
    loss, stats = spec.loss_fn(logp, old, adv, mask, **spec.hyper, agg=spec.agg, **norm)
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
