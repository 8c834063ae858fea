"""Supervised fine-tuning on multi-turn tool trajectories: the loss is on assistant tokens only.

Each row (`messages` in the OpenAI form, assistant `tool_calls`, `tool` results) is rendered by the chat renderer,
which sets loss_mask = 1 on assistant content (reasoning, tool-call JSON, closing `<|im_end|>`) and 0 on system,
user and tool turns, so the model never learns to predict sandbox output. Plain `prompt`/`completion` string rows
(TRL's format) are accepted too, with the loss on the completion. The loss is the token mean over all trained tokens
of a batch; `loss_mean="micro"` takes verl's instead (the mean over micro-batches of each one's token mean).

Under torchrun each batch is dealt out over the ranks (`tirl.train.dist.rank_share`); the token count that
normalizes the loss is summed over ranks, so the gradient is the whole batch's.

`SFTTrainer` is the loop over one `SFTRun` (its inputs, rendered and sized by `sft_run`, as `RLRun` is RL's); it
is checkpointed and resumed through `tirl.train.checkpoint.Resumable`, as the RL trainer is. Its data order is a plan of batches rebuilt from the seed, so its position is the step alone.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tirl.chat.template import ChatRenderer
from tirl.core.logging import MetricsLogger
from tirl.core.progress import progress
from tirl.data.lengths import check_row_chars
from tirl.train import checkpoint, dist, manifest
from tirl.train.batch import TokenBatch, collate
from tirl.train.config import SFTConfig
from tirl.train.dist import all_reduce_sum
from tirl.train.fsdp import MicroBatchPasses
from tirl.train.logprobs import autocast_context, backward_outside_autocast, token_logprobs
from tirl.train.memory import MicroBatchBudget, resolve_micro_batch_tokens, sized_micro_batches
from tirl.train.optim import SkipGuard, build_optimizer, clip_and_step
from tirl.train.signals import graceful_stop


def render_rows(
    rows: Sequence[dict[str, Any]], renderer: ChatRenderer, *, max_length: int, source: str = ""
) -> list[tuple[list[int], list[int]]]:
    """(ids, loss mask) per row, or per assistant turn of a row with chat.history=per_turn
    (`ChatRenderer.samples`); an error names `source` (the data file) and the row, counted from 1. A row with more
    characters than `max_length` tokens can hold is refused before it is tokenized (`tirl.data.lengths`)."""
    out = []
    for n, row in enumerate(rows, start=1):
        where = f"{source or 'SFT data'}: row {n}"
        check_row_chars(row, max_length, where=where, key="sft.max_length")  # before a tokenizer sees it
        if isinstance(row.get("prompt"), str) and isinstance(row.get("completion"), str):
            prompt, completion = renderer.encode(row["prompt"]), renderer.encode(row["completion"])
            samples = [(prompt + completion, [0] * len(prompt) + [1] * len(completion))]
        else:
            msgs = row.get("messages")
            if not isinstance(msgs, list) or not msgs:
                raise ValueError(
                    f"{where}: expected a non-empty 'messages' list (or 'prompt' and "
                    f"'completion' strings), got {type(msgs).__name__}"
                )
            try:
                samples = renderer.samples(msgs, tools=row.get("tools"))
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError(f"{where}: {e}") from e
        for ids, mask in samples or [([], [])]:  # per_turn: a row without assistant turns has no samples
            if len(ids) > max_length:
                raise ValueError(f"{where}: {len(ids)} tokens exceed sft.max_length={max_length}")
            if sum(mask) == 0:
                raise ValueError(f"{where}: no assistant tokens to train on")
        out += samples
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


def micro_tokens(micro: TokenBatch) -> float:
    """Trained tokens of a micro-batch (at least 1): the denominator of its own token mean."""
    return float(max(1, int(micro.loss_mask[:, 1:].sum())))


def sft_step(
    model: torch.nn.Module,
    batch: TokenBatch | None,
    cfg: SFTConfig,
    device: torch.device | str = "cpu",
    *,
    autocast: torch.dtype | None = None,
) -> tuple[float, int]:
    """Forward and backward over the batch's micro-batches (gradients accumulate); returns (loss, trained tokens),
    both of the whole batch over all ranks. `batch` None: this rank has no rows of this batch (its last one)."""
    num_tokens = torch.zeros((), device=device)
    if batch is not None:
        mask = batch.loss_mask.clone()
        mask[:, 0] = 0
        num_tokens = mask.sum()
    num_tokens = all_reduce_sum(num_tokens).clamp(min=1.0)
    tokens = resolve_micro_batch_tokens(
        cfg.micro_batch_tokens, model, autocast=autocast
    ).tokens  # SFTTrainer's: resolved
    passes = MicroBatchPasses(model, batch, max_seqs=cfg.micro_batch_size, max_tokens=tokens)
    num_micro = 0.0  # loss_mean="micro": the micro-batches of the whole batch, over all ranks
    if cfg.loss_mean == "micro":
        num_micro = float(all_reduce_sum(torch.tensor(float(sum(p is not None for p in passes.parts)))))
    total, n = 0.0, 0
    # weights cast once per batch (tirl.train.rl.update); `batch` may be None on this rank
    with autocast_context(torch.device(device), autocast):
        for _, micro in passes:
            denom = num_tokens if cfg.loss_mean == "token" else micro_tokens(micro) * num_micro
            loss, k = sft_loss(model, micro, num_tokens=denom, autocast=autocast)
            if loss.requires_grad:
                backward_outside_autocast(loss)
            total, n = total + float(loss.detach()), n + k
    summed = dist.sum_floats({"loss": total, "tokens": float(n)})
    return summed["loss"], int(summed["tokens"])


@dataclass
class SFTRun:
    """The SFT trainer's inputs, rendered and sized (`sft_run` builds one), as `tirl.train.rl.run.RLRun` is RL's."""

    model: torch.nn.Module
    renderer: ChatRenderer
    examples: list[tuple[list[int], list[int]]]  # (ids, loss mask) per row
    cfg: SFTConfig  # micro_batch_tokens resolved to a number
    micro_budget: MicroBatchBudget  # how micro-batches were sized, printed at start
    pad_id: int
    seed: int
    logger: MetricsLogger | None = None
    label: str = "SFT"  # progress bars, metrics and errors name the stage by it
    out_dir: Path | None = None  # checkpoints go here; None: nothing is written
    autocast: torch.dtype | None = None  # model.autocast's dtype
    identity: checkpoint.RunIdentity | None = None  # what checkpoints record, and a resume must match


def sft_run(
    model: torch.nn.Module,
    renderer: ChatRenderer,
    rows: Sequence[dict[str, Any]],
    cfg: SFTConfig,
    *,
    pad_id: int,
    seed: int,
    autocast: torch.dtype | None = None,
    activation_gib: float = 0.0,
    out_dir: str | Path | None = None,
    **rest: Any,
) -> SFTRun:
    """The `SFTRun` of these parts: `micro_batch_tokens: auto` sized for `activation_gib` (tirl.train.memory), every
    row rendered (an error names the row). `rest`: SFTRun's optional fields (logger, label, identity)."""
    cfg, budget = sized_micro_batches(cfg, model, autocast, activation_gib)
    examples = render_rows(rows, renderer, max_length=cfg.max_length, source=cfg.data)
    out = Path(out_dir) if out_dir is not None else None
    return SFTRun(
        model, renderer, examples, cfg, budget, pad_id, seed, out_dir=out, autocast=autocast, **rest
    )


class SFTTrainer:
    """SFT over a plan of batches fixed by the seed: `train()` runs from `step_done` to the end of the plan.

    With `run.out_dir`, a resumable checkpoint goes to `out_dir`/checkpoint-<step> every `cfg.save_every` steps and
    when SIGTERM/SIGINT ask to stop (then `StopRequested` is raised); without it nothing is written.
    """

    rank_state: tuple[str, ...] = ()  # every rank draws the same plan: nothing of its own

    def __init__(self, run: SFTRun) -> None:
        """`run`: the model, rendered rows and settings (`sft_run`); the trainer adds only its plan of batches, the
        optimizer and its counters."""
        self.run = run  # kept whole, read where needed: the trainer copies none of its fields
        cfg = run.cfg
        rng = random.Random(run.seed)
        lengths = [len(e[0]) for e in run.examples]
        window = 50 if cfg.group_by_length else 1
        epochs = [
            length_grouped_batches(lengths, cfg.batch_size, rng, window=window) for _ in range(cfg.epochs)
        ]
        # (epoch, row indices) of every step
        self.plan = [(epoch, idx) for epoch, batches in enumerate(epochs) for idx in batches]
        self.opt, self.sched = build_optimizer(run.model, cfg.optim, len(self.plan))
        self.skips = SkipGuard(cfg.optim.max_skipped_in_row)
        self.step_done = 0

    @property
    def model(self) -> torch.nn.Module:
        return self.run.model

    @property
    def identity(self) -> checkpoint.RunIdentity | None:
        return self.run.identity

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self.opt

    def state_dict(self) -> dict[str, Any]:
        return {
            "step": self.step_done,
            "scheduler": self.sched.state_dict(),
            "skips": (self.skips.in_row, self.skips.total),
            "wandb_id": self.run.logger.run_id if self.run.logger else None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step_done = int(state["step"])
        self.sched.load_state_dict(state["scheduler"])
        self.skips.in_row, self.skips.total = state["skips"]

    def _batch(self, idx: list[int]) -> TokenBatch | None:
        """This rank's share of the rows `idx`, collated on the model's device; None when it has none."""
        chunk = [self.run.examples[i] for i in dist.rank_share(idx)]
        if not chunk:
            return None
        device = next(self.model.parameters()).device
        return collate([c[0] for c in chunk], [c[1] for c in chunk], pad_id=self.run.pad_id).to(device)

    def step(self, step: int) -> dict[str, float]:
        """One optimizer step on the plan's batch `step`; returns its metrics."""
        epoch, idx = self.plan[step]
        device = next(self.model.parameters()).device
        loss, n = sft_step(self.model, self._batch(idx), self.run.cfg, device, autocast=self.run.autocast)
        grad_norm, stepped = clip_and_step(self.model, self.opt, self.sched, self.run.cfg.optim, loss=loss)
        self.skips.record(stepped, where=f"{self.run.label} step {step}")
        return {
            "sft/loss": loss,
            "sft/grad_norm": grad_norm,
            "sft/tokens": float(n),
            "sft/lr": self.sched.get_last_lr()[0],
            "sft/epoch": float(epoch),
            "sft/skipped_updates": float(self.skips.total),
        }

    def train(self) -> dict[str, float]:
        """Train in place to the end of the plan; returns the last logged metrics."""
        run = self.run
        self.model.train()
        last: dict[str, float] = {}
        with graceful_stop() as stop, progress(run.label, len(self.plan)) as bar:
            bar.advance(self.step_done)
            for step in range(self.step_done, len(self.plan)):
                last = self.step(step)
                if run.logger:
                    run.logger.log(last, step=step)
                manifest.check_weights(self.model, f"{run.label} step {step}")
                bar.advance(1, info=f"loss {last['sft/loss']:.3f}")
                self.step_done = step + 1
                stopping = dist.any_rank(stop.requested)
                if run.out_dir is None:
                    continue
                checkpoint.save_if_due(
                    self, run.out_dir, step=self.step_done, every=run.cfg.save_every, stopping=stopping,
                    tokenizer=run.renderer.tokenizer, keep_last=run.cfg.keep_last,
                )  # fmt: skip
        first = len(self.plan) - self.skips.in_row  # one update per step
        manifest.check_last_update(self.skips.in_row, f"{run.label} step {first}")
        self.model.eval()
        return last


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
    autocast: torch.dtype | None = None,
) -> dict[str, float]:
    """Train `model` in place without checkpoints (`SFTTrainer` for a run that writes them); returns the last
    logged metrics."""
    run = sft_run(
        model, renderer, rows, cfg, pad_id=pad_id, seed=seed, logger=logger, label=label, autocast=autocast
    )
    return SFTTrainer(run).train()
