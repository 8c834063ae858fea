"""Reading a checkpoint back: verified against its manifest, then its trainer state, its optimizer and its weights,
each failure naming the checkpoint and the file.

Whatever wrote it, one process or a sharded run: DCP shards load into a sharded or a whole model alike (DCP
reshards, so such a checkpoint resumes in any number of processes), safetensors only into a whole one, and a rank
gets its own entries back (`rank-<r>.pt`). Only files the manifest lists are read.

Not here: the layout and its writing (`tirl.train.checkpoint_write`), the order a trainer is restored in
(`tirl.train.checkpoint.restore_trainer`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from tirl.models import lora
from tirl.train import dist, manifest
from tirl.train.checkpoint_write import DCP_DIR, PER_RANK, RANK_KEYS, STATE, dcp_options, drop_frozen_aliases
from tirl.train.fsdp import is_sharded
from tirl.train.manifest import CheckpointError, RunIdentity

_ONE_PROCESS = (
    "was written by a single process; resume it in a single process (a sharded checkpoint, written under "
    "torchrun, resumes in any number of processes)"
)


def verify(path: str | Path, *, hashes: bool = True) -> None:
    """Raise `CheckpointError` naming the first missing or damaged file of the checkpoint at `path`."""
    manifest.verify(path, hashes=hashes)


def is_sharded_checkpoint(path: str | Path) -> bool:
    return (Path(path) / DCP_DIR).is_dir()


def load_state(path: str | Path, expect: RunIdentity | None = None) -> dict[str, Any]:
    """The trainer state of a verified checkpoint (the weights are read by the caller with `load_weights`); with
    `expect`, the checkpoint must be that stage's, with those settings (`tirl.train.manifest.check_identity`).

    Of a sharded checkpoint: with this rank's own entries (generators, `Resumable.rank_state`) when the saving run
    had this rank (a rank it did not have keeps rank 0's global generators and drops rank 0's other own entries:
    its trainer keeps what it seeded), and `checkpoint_dir` set for `load_optimizer`."""
    # rank 0 alone reads every byte to hash it; if it fails, torchrun stops the other ranks
    written = manifest.verify(path, hashes=dist.is_main())
    state = _load(Path(path) / STATE)
    if expect is not None:
        manifest.check_identity(path, written, state, expect)
    if is_sharded_checkpoint(path):
        state["checkpoint_dir"] = str(path)
        own = Path(path) / f"rank-{dist.rank()}.pt"
        if own.is_file():
            state.update(_load(own))
        else:
            for key in state.get(RANK_KEYS, PER_RANK):
                if key != "rng":
                    state.pop(key, None)
    return state


def saved_world(state: dict[str, Any]) -> int | None:
    """How many processes wrote the sharded checkpoint `state` came from (None: one process, or not sharded)."""
    return int(state["world_size"]) if "checkpoint_dir" in state and "world_size" in state else None


def every_rank(state: dict[str, Any], key: str) -> list[Any]:
    """Entry `key` of every saving rank's own state, in rank order, from the sharded checkpoint `state` came from
    (a run resumed on another number of processes deals them out again: `tirl.train.rl.reshard`)."""
    path, world = Path(state["checkpoint_dir"]), saved_world(state)
    out = []
    for r in range(world or 0):
        f = path / f"rank-{r}.pt"
        if not f.is_file():
            raise CheckpointError(f"checkpoint {path}: {f.name} is missing (the run had {world} processes)")
        out.append(_load(f).get(key))
    return out


def _load(f: Path) -> dict[str, Any]:
    try:
        return torch.load(f, weights_only=False)
    except Exception as e:  # a file of the right size that torch cannot read
        raise CheckpointError(
            f"checkpoint {f.parent}: {f.name} is corrupt ({type(e).__name__}: {e})"
        ) from None


def load_optimizer(model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Restore `optimizer` from a trainer state: its own entry (single-process checkpoints) or the DCP shards
    of the checkpoint it came from, resharded onto this run's processes (collective when sharded)."""
    if "optimizer" in state:
        if is_sharded(model):
            raise CheckpointError(f"this checkpoint {_ONE_PROCESS}")
        optimizer.load_state_dict(state["optimizer"])
        return
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

    options = dcp_options(model)
    box = {"optim": get_optimizer_state_dict(model, optimizer, options=options)}
    _dcp_load(box, Path(state["checkpoint_dir"]))
    set_optimizer_state_dict(model, optimizer, box["optim"], options=options)


def _dcp_load(box: dict[str, Any], path: Path) -> None:
    """DCP shards into `box` in place; in one process, without DCP's warning that it assumes one process."""
    import warnings

    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(box, checkpoint_id=path / DCP_DIR)


def load_weights(model: torch.nn.Module, path: str | Path) -> None:
    """Load the checkpoint's weights into `model` in place (same architecture), naming the file on failure.

    DCP shards load into a sharded or a whole model alike (collective when sharded); safetensors only into a
    whole one. A LoRA model takes the checkpoint's adapter, after checking that it was trained on the same base."""
    if is_sharded_checkpoint(path):
        _load_dcp_weights(model, path)
        return
    if is_sharded(model):
        raise CheckpointError(f"checkpoint {path} {_ONE_PROCESS}")
    if lora.is_lora(model) or lora.is_adapter_dir(path):
        try:
            lora.load_adapter_weights(model, path)
        except lora.LoraError as e:
            raise CheckpointError(str(e)) from None
        return
    _load_safetensors(model, path)


def _load_dcp_weights(model: torch.nn.Module, path: str | Path) -> None:
    """A sharded checkpoint's DCP shards into `model` (collective when sharded): full weights into a full model, an
    adapter into a LoRA model on the same base."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    if lora.is_lora(model) != lora.is_adapter_dir(path):
        raise CheckpointError(
            f"checkpoint {path} holds {'a LoRA adapter' if lora.is_adapter_dir(path) else 'full weights'} but "
            f"the model is {'a LoRA model' if lora.is_lora(model) else 'not'}: set model.lora.rank as the run did"
        )
    if lora.is_lora(model):
        try:
            lora.check_same_base(model, path)
        except lora.LoraError as e:
            raise CheckpointError(str(e)) from None
    options = dcp_options(model)
    box = {"model": drop_frozen_aliases(model, get_model_state_dict(model, options=options))}
    try:
        _dcp_load(box, Path(path))
    except Exception as e:
        raise CheckpointError(
            f"checkpoint {path}: {DCP_DIR}/ does not load ({type(e).__name__}: {e})"
        ) from None
    set_model_state_dict(model, box["model"], options=options)


def _load_safetensors(model: torch.nn.Module, path: str | Path) -> None:
    """A single process's full weights into a whole `model`; a tied LM head may be missing from the files."""
    from safetensors.torch import load_file

    files = _listed(Path(path), ".safetensors")
    if not files:
        raise CheckpointError(f"checkpoint {path}: its manifest lists no *.safetensors weights")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            state.update(load_file(f))
        except Exception as e:
            raise CheckpointError(f"checkpoint {path}: {f.name} is corrupt ({e})") from None
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {k for k in missing if "lm_head" in k and getattr(model.config, "tie_word_embeddings", False)}
    if set(missing) - tied or unexpected:
        raise CheckpointError(
            f"checkpoint {path}: weights do not fit the model (missing {sorted(set(missing) - tied)[:5]}, "
            f"unexpected {sorted(unexpected)[:5]})"
        )


def _listed(path: Path, suffix: str) -> list[Path]:
    """The top-level files of the checkpoint at `path` ending in `suffix` that its manifest lists: a file added
    later (`zz.safetensors`) is never read, whatever its name (`tirl.train.manifest.verify` refuses it too)."""
    names = manifest.read(path)["files"]
    return [path / n for n in sorted(names) if n.endswith(suffix) and "/" not in n]
