"""Supervised fine-tuning on multi-turn tool trajectories: the loss is on assistant tokens only.

Each row (`messages` in the OpenAI form, assistant `tool_calls`, `tool` results) is rendered by the chat renderer,
which sets loss_mask = 1 on assistant content (reasoning, tool-call JSON, closing `<|im_end|>`) and 0 on system,
user and tool turns, so the model never learns to predict sandbox output. Plain `prompt`/`completion` string rows
(TRL's format) are accepted too, with the loss on the completion. The loss is the token mean over all trained tokens
of a batch, as the reference recipe's SFT.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from tirl.chat.template import ChatRenderer
from tirl.logging import MetricsLogger
from tirl.progress import progress
from tirl.train.batch import TokenBatch, collate
from tirl.train.optim import OptimConfig, SkipGuard, build_optimizer, clip_and_step


@dataclass
class SFTConfig:
    data: str = ""  # JSONL of rows with `messages`
    epochs: int = 3
    batch_size: int = 32
    max_length: int = 1024  # a longer conversation is an error naming the row, never silently cut
    group_by_length: bool = False  # similar lengths per batch: less padding, but batches less mixed
    optim: OptimConfig = field(
        default_factory=lambda: OptimConfig(lr=1e-5, schedule="cosine", warmup_ratio=0.1)
    )

    def __post_init__(self) -> None:
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


def sft_loss(model: torch.nn.Module, batch: TokenBatch) -> tuple[torch.Tensor, int]:
    """Token-mean cross-entropy over loss_mask; returns (loss, number of trained tokens)."""
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[
        :, :-1
    ]  # (B, T-1, V)
    target = batch.input_ids[:, 1:]
    mask = batch.loss_mask[:, 1:]
    ce = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), target.reshape(-1), reduction="none")
    n = int(mask.sum().item())
    return (ce * mask.reshape(-1)).sum() / max(1, n), n


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
) -> dict[str, float]:
    """Train in place; returns the last logged metrics."""
    examples = render_rows(rows, renderer, max_length=cfg.max_length)
    rng = random.Random(seed)
    lengths = [len(e[0]) for e in examples]
    window = 50 if cfg.group_by_length else 1
    plan = [length_grouped_batches(lengths, cfg.batch_size, rng, window=window) for _ in range(cfg.epochs)]
    total = sum(len(p) for p in plan)
    opt, sched = build_optimizer(model, cfg.optim, total)
    device = next(model.parameters()).device
    model.train()
    guard = SkipGuard(cfg.optim.max_skipped_in_row)
    step, last = 0, {}
    with progress(label, total) as bar:
        for epoch, batches in enumerate(plan):
            for idx in batches:
                chunk = [examples[i] for i in idx]
                batch = collate([c[0] for c in chunk], [c[1] for c in chunk], pad_id=pad_id).to(device)
                loss, n = sft_loss(model, batch)
                loss.backward()
                grad_norm, stepped = clip_and_step(model, opt, sched, cfg.optim, loss=loss.item())
                guard.record(stepped, where=f"{label} step {step}")
                last = {
                    "sft/loss": loss.item(),
                    "sft/grad_norm": grad_norm,
                    "sft/tokens": float(n),
                    "sft/lr": sched.get_last_lr()[0],
                    "sft/epoch": float(epoch),
                    "sft/skipped_updates": float(guard.total),
                }
                if logger:
                    logger.log(last, step=step)
                step += 1
                bar.advance(1, info=f"loss {last['sft/loss']:.3f}")
    model.eval()
    return last
