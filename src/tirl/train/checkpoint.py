"""Training checkpoints that a run can resume from exactly: what a checkpoint holds, and the one contract through
which both trainers are saved and restored.

A checkpoint `checkpoint-<step>/` is a Hugging Face model directory (weights, config, tokenizer; for LoRA the
adapter and `base_model.json`, see `tirl.models.lora`) plus
`trainer_state.pt` (optimizer, scheduler, counters, data order, every random generator, what the trainer needs
next) and `manifest.json`, written last, listing every file with its size and hash, and the run's stage and
settings (`tirl.train.manifest`). The directory is staged and renamed in one step (`tirl.core.io.atomic_dir`), so a
crash or a full disk leaves either the whole checkpoint or none; the manifest catches files damaged later
(truncated, deleted, overwritten) and a resume with other settings, and loading names the bad file or setting.

A run sharded over several processes (FSDP) writes the same directory with the weights and the optimizer as
`torch.distributed.checkpoint` (DCP) shards under `dcp/` instead of safetensors and `trainer_state.pt`'s optimizer,
plus `rank-<r>.pt` per rank (that rank's generators); `config.json` and the tokenizer are still there. For LoRA,
DCP holds the adapter and its optimizer state only, and the adapter is also written whole, as one process writes
it (adapter files and `base_model.json`), so the checkpoint reads as any adapter directory does. DCP
reshards on load, so such a checkpoint resumes in any number of processes, one included. The final model of such a
run is a plain Hugging Face directory (`tirl.train.fsdp.save_full_model`).

Both trainers are checkpointed through one contract, `Resumable`: `save_trainer` writes what a trainer exposes
(weights, optimizer, its `state_dict()`, every global generator) and `restore_trainer` puts all of it back, so a
resumed run continues bit for bit. Stages only say when and from where. The parts: writing a checkpoint
(`tirl.train.checkpoint_write`), reading one back (`tirl.train.checkpoint_read`), the global generators
(`tirl.train.rng`), and which checkpoints a run directory keeps (`tirl.train.run_outputs`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import torch

from tirl.train.checkpoint_read import load_optimizer, load_state, load_weights
from tirl.train.checkpoint_write import save
from tirl.train.manifest import RunIdentity
from tirl.train.rng import set_rng_state
from tirl.train.run_outputs import rotate
from tirl.train.signals import StopRequested


class Resumable(Protocol):
    """What a trainer exposes so that a checkpoint can stop it and a later run continue it exactly.

    `state_dict()` is everything its next step depends on besides the weights, the optimizer and the global
    generators (the checkpoint takes those itself): the step, the scheduler, the data order and position, the
    trainer's own generators and counters. A trainer that gains state (a batch still in flight, say) adds entries
    to it and reads them back in `load_state_dict`; entries every rank has its own of are named in `rank_state`.
    `load_state_dict` runs after the weights and the optimizer are restored, before the global generators are.
    """

    @property
    def model(self) -> torch.nn.Module: ...

    @property
    def optimizer(self) -> torch.optim.Optimizer: ...

    rank_state: tuple[str, ...]
    # the stage and settings its checkpoints record (set by the stage that runs it)
    identity: RunIdentity | None

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def save_trainer(trainer: Resumable, out_dir: str | Path, *, tokenizer: Any, keep_last: int) -> Path:
    """`out_dir`/checkpoint-<step> of `trainer`, then `rotate(out_dir, keep_last)`. Collective when sharded."""
    state = trainer.state_dict()
    path = save(
        Path(out_dir) / f"checkpoint-{state['step']}",
        model=trainer.model,
        tokenizer=tokenizer,
        state=state,
        optimizer=trainer.optimizer,
        per_rank=("rng", *trainer.rank_state),
        identity=trainer.identity,
    )
    rotate(out_dir, keep_last)
    return path


def save_if_due(
    trainer: Resumable,
    out_dir: str | Path,
    *,
    step: int,
    every: int,
    stopping: bool,
    tokenizer: Any,
    keep_last: int,
) -> None:
    """The one resumable-state writer of both trainers' loops, after `step` steps: `save_trainer` every `every`
    steps (0: never) and when a stop was requested, then raise `StopRequested` naming the checkpoint to resume."""
    if (every and step % every == 0) or stopping:
        path = save_trainer(trainer, out_dir, tokenizer=tokenizer, keep_last=keep_last)
        if stopping:
            raise StopRequested(str(path), step)


def restore_trainer(
    trainer: Resumable, path: str | Path, state: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Put `trainer` back where the checkpoint at `path` left it: weights, optimizer, its own state, then every
    global generator (last, so nothing draws from them before the next step). `state`: the checkpoint's
    `load_state`, when the caller has already read it. Returns that state."""
    state = load_state(path) if state is None else state
    load_weights(trainer.model, path)
    load_optimizer(trainer.model, trainer.optimizer, state)
    trainer.load_state_dict(state)
    set_rng_state(state["rng"])
    return state
