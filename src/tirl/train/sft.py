"""Supervised fine-tuning on multi-turn tool trajectories: the loss is on assistant tokens only.

Each row (`messages` in the OpenAI form, assistant `tool_calls`, `tool` results) is rendered by the chat renderer,
which sets loss_mask = 1 on assistant content (reasoning, tool-call JSON, closing `<|im_end|>`) and 0 on system,
user and tool turns, so the model never learns to predict sandbox output. Plain `prompt`/`completion` string rows
(TRL's format) are accepted too, with the loss on the completion. The loss is the token mean over all trained tokens
of a batch, as the reference recipe's SFT.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from tirl.chat.template import ChatRenderer
from tirl.logging import MetricsLogger
from tirl.progress import progress
from tirl.train.batch import TokenBatch, collate, micro_batches, slice_rows
from tirl.train.dist import all_reduce_sum
from tirl.train.logprobs import token_logprobs
from tirl.train.optim import OptimConfig, SkipGuard, build_optimizer, clip_and_step
from tirl.train.signals import StopRequested, graceful_stop


@dataclass
class SFTConfig:
    data: str = ""  # JSONL of rows with `messages`
    epochs: int = 3
    batch_size: int = 32
    max_length: int = 1024  # a longer conversation is an error naming the row, never silently cut
    group_by_length: bool = False  # similar lengths per batch: less padding, but batches less mixed
    micro_batch_size: int = 0  # sequences per forward/backward (gradients accumulate); 0 = the whole batch
    micro_batch_tokens: int = 0  # padded tokens per forward/backward; 0 = no budget
    save_every: int = 0  # steps between resumable checkpoints (checkpoint-<step>/, `tirl sft` only); 0 = none
    keep_last: int = 0  # complete checkpoints kept, oldest deleted first, never the newest; 0 = all
    optim: OptimConfig = field(
        default_factory=lambda: OptimConfig(lr=1e-5, beta2=0.95, schedule="cosine", warmup_ratio=0.1)
    )

    def __post_init__(self) -> None:
        if self.micro_batch_size < 0 or self.micro_batch_tokens < 0:
            raise ValueError(
                f"micro_batch_size and micro_batch_tokens must be >= 0 (0 = no limit), "
                f"got {self.micro_batch_size}, {self.micro_batch_tokens}"
            )
        if self.save_every < 0 or self.keep_last < 0:
            raise ValueError(
                f"save_every and keep_last must be >= 0, got {self.save_every}, {self.keep_last}"
            )
        if self.epochs < 0 or self.batch_size < 1:
            raise ValueError(
                f"epochs must be >= 0 (0 skips the stage) and batch_size >= 1, "
                f"got {self.epochs}, {self.batch_size}"
            )


def render_rows(
    rows: Sequence[dict[str, Any]], renderer: ChatRenderer, *, max_length: int
) -> list[tuple[list[int], list[int]]]:
    out = []
    for i, row in enumerate(rows):
        if isinstance(row.get("prompt"), str) and isinstance(row.get("completion"), str):
            prompt, completion = renderer.encode(row["prompt"]), renderer.encode(row["completion"])
            ids, mask = prompt + completion, [0] * len(prompt) + [1] * len(completion)
        else:
            msgs = row.get("messages")
            if not isinstance(msgs, list) or not msgs:
                raise ValueError(
                    f"SFT row {i}: expected a non-empty 'messages' list (or 'prompt' and "
                    f"'completion' strings), got {type(msgs).__name__}"
                )
            try:
                ids, mask = renderer.render(msgs, tools=row.get("tools"))
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError(f"SFT row {i}: {e}") from e
        if len(ids) > max_length:
            raise ValueError(f"SFT row {i}: {len(ids)} tokens exceed sft.max_length={max_length}")
        if sum(mask) == 0:
            raise ValueError(f"SFT row {i}: no assistant tokens to train on")
        out.append((ids, mask))
    return out


def length_grouped_batches(
    lengths: Sequence[int], batch_size: int, rng: random.Random, *, window: int = 50
) -> list[list[int]]:
    """Shuffled batches of indices; within windows of `window` batches, similar lengths share a batch.

    window=1 gives plain random batches. Grouping saves padding but makes each batch less mixed, which slowed a
    tiny model's learning several-fold in the demo, so it is off by default.
    """
    order = list(range(len(lengths)))
    rng.shuffle(order)
    batches = []
    for s in range(0, len(order), batch_size * window):
        chunk = sorted(order[s : s + batch_size * window], key=lambda i: lengths[i])
        batches += [chunk[k : k + batch_size] for k in range(0, len(chunk), batch_size)]
    rng.shuffle(batches)
    return batches


def sft_loss(
    model: torch.nn.Module,
    batch: TokenBatch,
    *,
    num_tokens: torch.Tensor | float | None = None,
    autocast: torch.dtype | None = None,
) -> tuple[torch.Tensor, int]:
    """Cross-entropy summed over loss_mask and divided by `num_tokens` (the whole batch's trained tokens when this is
    one micro-batch of it; default: this batch's own), computed on trained positions only, in chunks; returns
    (loss, number of trained tokens here)."""
    logp, _ = token_logprobs(
        model, batch.input_ids, batch.attention_mask, loss_mask=batch.loss_mask, autocast=autocast
    )
    mask = batch.loss_mask.clone()
    mask[:, 0] = 0  # nothing predicts the first token
    n = int(mask.sum().item())
    denom = max(1, n) if num_tokens is None else num_tokens
    return -(logp * mask).sum() / denom, n


def sft_step(
    model: torch.nn.Module, batch: TokenBatch, cfg: SFTConfig, *, autocast: torch.dtype | None = None
) -> tuple[float, int]:
    """Forward and backward over the batch's micro-batches (gradients accumulate); returns (loss, trained tokens)."""
    mask = batch.loss_mask.clone()
    mask[:, 0] = 0
    num_tokens = all_reduce_sum(mask.sum()).clamp(min=1.0)
    lengths = batch.attention_mask.sum(dim=-1).tolist()
    total, n = 0.0, 0
    for rows in micro_batches(lengths, max_seqs=cfg.micro_batch_size, max_tokens=cfg.micro_batch_tokens):
        loss, k = sft_loss(model, slice_rows(batch, rows), num_tokens=num_tokens, autocast=autocast)
        if loss.requires_grad:
            loss.backward()
        total, n = total + float(loss.detach()), n + k
    return total, n


def train_sft(
    model: torch.nn.Module,
    renderer: ChatRenderer,
    rows: Sequence[dict[str, Any]],
    cfg: SFTConfig,
    *,
    pad_id: int,
    seed: int,
    logger: MetricsLogger | None = None,
    label: str = "SFT",
    save: Callable[[int, dict[str, Any]], Path] | None = None,
    resume_state: dict[str, Any] | None = None,
    autocast: torch.dtype | None = None,
) -> dict[str, float]:
    """Train in place; returns the last logged metrics.

    `save(step, state)` writes a resumable checkpoint every `cfg.save_every` steps and when SIGTERM/SIGINT ask to
    stop (then `StopRequested` is raised). `resume_state` (a checkpoint's trainer state) continues a run: the batch
    plan is rebuilt from the seed, the batches already trained are skipped, optimizer and schedule restored.
    `autocast`: `model.autocast`'s dtype (forward and backward under torch.autocast), None for full precision.
    """
    examples = render_rows(rows, renderer, max_length=cfg.max_length)
    rng = random.Random(seed)
    lengths = [len(e[0]) for e in examples]
    window = 50 if cfg.group_by_length else 1
    plan = [length_grouped_batches(lengths, cfg.batch_size, rng, window=window) for _ in range(cfg.epochs)]
    flat = [(epoch, idx) for epoch, batches in enumerate(plan) for idx in batches]
    opt, sched = build_optimizer(model, cfg.optim, len(flat))
    guard = SkipGuard(cfg.optim.max_skipped_in_row)
    start = 0
    if resume_state is not None:
        start = int(resume_state["step"])
        opt.load_state_dict(resume_state["optimizer"])
        sched.load_state_dict(resume_state["scheduler"])
        guard.in_row, guard.total = resume_state["skips"]
    device = next(model.parameters()).device
    model.train()
    last: dict[str, float] = {}
    with graceful_stop() as stop, progress(label, len(flat)) as bar:
        bar.advance(start)
        for step in range(start, len(flat)):
            epoch, idx = flat[step]
            chunk = [examples[i] for i in idx]
            batch = collate([c[0] for c in chunk], [c[1] for c in chunk], pad_id=pad_id).to(device)
            loss, n = sft_step(model, batch, cfg, autocast=autocast)
            grad_norm, stepped = clip_and_step(model, opt, sched, cfg.optim, loss=loss)
            guard.record(stepped, where=f"{label} step {step}")
            last = {
                "sft/loss": loss,
                "sft/grad_norm": grad_norm,
                "sft/tokens": float(n),
                "sft/lr": sched.get_last_lr()[0],
                "sft/epoch": float(epoch),
                "sft/skipped_updates": float(guard.total),
            }
            if logger:
                logger.log(last, step=step)
            bar.advance(1, info=f"loss {last['sft/loss']:.3f}")
            done = step + 1
            if save is not None and ((cfg.save_every and done % cfg.save_every == 0) or stop.requested):
                state = {
                    "step": done,
                    "optimizer": opt.state_dict(),
                    "scheduler": sched.state_dict(),
                    "skips": (guard.in_row, guard.total),
                }
                path = save(done, state)
                if stop.requested:
                    raise StopRequested(str(path), done)
    model.eval()
    return last
