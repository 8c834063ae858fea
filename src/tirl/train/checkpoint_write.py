"""Writing one checkpoint directory, whole or not at all: the layout `tirl.train.checkpoint` describes, by one
process or by every rank of a sharded run together.

One process stages the directory (`tirl.core.io.atomic_dir`), writes the model (or LoRA adapter), the tokenizer,
`trainer_state.pt` with the optimizer and the global generators, then the manifest, and renames it into place. A
sharded run (FSDP) writes the weights and the optimizer as DCP shards under `dcp/`, each rank its own
`rank-<r>.pt`; rank 0 stages, writes what is shared and renames once every rank's files are in. Before anything is
written every tensor is checked finite, and an OS error is one line naming the checkpoint
(`tirl.train.manifest`).

Not here: reading a checkpoint back (`tirl.train.checkpoint_read`), which checkpoints a run keeps
(`tirl.train.run_outputs`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from tirl.core.io import atomic_dir
from tirl.models import lora
from tirl.models.loading import tied_aliases
from tirl.train import dist, manifest
from tirl.train.fsdp import full_state_dict, is_sharded
from tirl.train.manifest import RunIdentity
from tirl.train.rng import rng_state

STATE = "trainer_state.pt"
DCP_DIR = "dcp"  # sharded weights and optimizer of a multi-process run
PER_RANK = ("rng", "generator")  # each rank's own entries, unless a trainer names them (`rank_state`)
RANK_KEYS = "rank_keys"  # a sharded checkpoint's record of which entries those were


def save(
    path: str | Path,
    *,
    model: torch.nn.Module,
    tokenizer: Any,
    state: dict[str, Any],
    optimizer: torch.optim.Optimizer | None = None,
    per_rank: tuple[str, ...] = PER_RANK,
    identity: RunIdentity | None = None,
) -> Path:
    """Write a complete checkpoint at `path` atomically; `state` is the trainer's (`tirl.train.checkpoint`),
    `identity` the stage and settings a resume must match (`tirl.train.manifest`).

    A sharded `model` is saved with its `optimizer` as DCP shards by every rank together (collective), and each
    rank's own `per_rank` entries of `state` in its `rank-<r>.pt`. Non-finite weights or optimizer state, and OS
    errors (a full disk), raise `CheckpointError` naming them."""
    path = Path(path)
    manifest.check_finite(path, model, optimizer)
    with manifest.os_errors(path):
        if is_sharded(model):
            if optimizer is None:
                raise ValueError(
                    "a sharded model's checkpoint needs its optimizer (saved as DCP shards with it)"
                )
            return _save_sharded(path, model, tokenizer, state, optimizer, per_rank, identity)
        own = {} if optimizer is None else {"optimizer": optimizer.state_dict()}
        with atomic_dir(path) as stage:
            lora.save_model(model, stage)  # a LoRA model: its adapter and the record of its base
            tokenizer.save_pretrained(stage)
            torch.save({**state, **own, "rng": rng_state()}, stage / STATE)
            manifest.write(stage, identity)
    return path


def _save_sharded(
    path: Path,
    model: torch.nn.Module,
    tokenizer: Any,
    state: dict[str, Any],
    optimizer: torch.optim.Optimizer,
    per_rank: tuple[str, ...],
    identity: RunIdentity | None,
) -> Path:
    """Rank 0 stages the directory and writes what is shared; every rank writes its DCP shards and generators;
    rank 0 writes the manifest and renames the stage once all are in. Every rank returns when it is complete."""

    def write(stage: Path) -> dict[str, torch.Tensor] | None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_sd, optim_sd = get_state_dict(model, optimizer, options=dcp_options(model))
        model_sd = drop_frozen_aliases(model, model_sd)
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=stage / DCP_DIR)
        own = {"rng": rng_state(), **{k: state[k] for k in per_rank if k in state}}
        torch.save(own, stage / f"rank-{dist.rank()}.pt")
        # a LoRA adapter is also gathered whole, so that the checkpoint is an adapter directory too (tirl eval,
        # tirl export and peft read it as they read a single process's)
        adapter = full_state_dict(model, trainable_only=True) if lora.is_lora(model) else None
        dist.barrier()  # every rank's files are in
        return adapter

    if not dist.is_main():
        write(Path(dist.broadcast_object(None)))
    else:
        with atomic_dir(path) as stage:
            dist.broadcast_object(str(stage))
            adapter = write(stage)
            if adapter is not None:
                lora.save_model(model, stage, state_dict=adapter)
            else:
                model.config.save_pretrained(stage)
            tokenizer.save_pretrained(stage)
            shared = {k: v for k, v in state.items() if k != "optimizer"}
            ranks = {RANK_KEYS: list(per_rank), "world_size": dist.world_size()}
            torch.save({**shared, "rng": rng_state(), **ranks}, stage / STATE)
            manifest.write(stage, identity)
    dist.barrier()  # renamed: complete for every rank
    return path


def dcp_options(model: torch.nn.Module) -> Any:
    """What goes into DCP, written and read alike: every weight, or for a LoRA model the adapter alone (its base is
    `model.path`'s, checked against the checkpoint's record of it when loading)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    adapter = lora.is_lora(model)
    return StateDictOptions(ignore_frozen_params=adapter, strict=not adapter)


def drop_frozen_aliases(model: torch.nn.Module, state: dict[str, Any]) -> dict[str, Any]:
    """`ignore_frozen_params` drops a frozen parameter under its first name only: a tied LM head's second name
    stays (torch 2.13). For a LoRA model, drop it too, so that DCP holds exactly the adapter."""
    if not lora.is_lora(model):
        return state
    aliases = tied_aliases(model)
    return {k: v for k, v in state.items() if k not in aliases}
