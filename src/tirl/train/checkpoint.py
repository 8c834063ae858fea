"""Training checkpoints that a run can resume from exactly: written whole or not at all, verified when read.

A checkpoint `checkpoint-<step>/` is a Hugging Face model directory (weights, config, tokenizer; for LoRA the
adapter and `base_model.json`, see `tirl.models.lora`) plus
`trainer_state.pt` (optimizer, scheduler, counters, data order, every random generator, what the trainer needs
next) and `manifest.json`, written last, listing every file with its size and hash, and the run's stage and
settings (`tirl.train.manifest`). The directory is staged and renamed in one step (`tirl.core.io.atomic_dir`), so a
crash or a full disk leaves either the whole checkpoint or none; the manifest catches files damaged later
(truncated, deleted, overwritten) and a resume with other settings, and loading names the bad file or setting.

Rotation (`keep_last`) deletes the oldest complete checkpoints, never the newest complete one. A process killed
while saving (SIGKILL, a lost node) leaves its staging directory behind; the next run into the directory removes
such leftovers of its own saves, and only those (`clean_staging`). A run that does not continue the directory's
checkpoints refuses to mix its steps with an earlier run's (`earlier_outputs`), unless told to start over there.

Both trainers are checkpointed through one contract, `Resumable`: `save_trainer` writes what a trainer exposes
(weights, optimizer, its `state_dict()`, every global generator) and `restore_trainer` puts all of it back, so a
resumed run continues bit for bit. Stages only say when and from where.

A run sharded over several processes (FSDP) writes the same directory with the weights and the optimizer as
`torch.distributed.checkpoint` (DCP) shards under `dcp/` instead of safetensors and `trainer_state.pt`'s optimizer,
plus `rank-<r>.pt` per rank (that rank's generators); `config.json` and the tokenizer are still there. For LoRA,
DCP holds the adapter and its optimizer state only, and the adapter is also written whole, as one process writes
it (adapter files and `base_model.json`), so the checkpoint reads as any adapter directory does. DCP
reshards on load, so such a checkpoint resumes in any number of processes, one included. The final model of such a
run is a plain Hugging Face directory (`tirl.train.fsdp.save_full_model`).
"""

from __future__ import annotations

import random
import re
import shutil
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from tirl.core.io import atomic_dir
from tirl.models import lora
from tirl.models.loading import tied_aliases
from tirl.train import dist, manifest
from tirl.train.fsdp import full_state_dict, is_sharded
from tirl.train.manifest import MANIFEST, CheckpointError, RunIdentity
from tirl.train.signals import StopRequested

STATE = "trainer_state.pt"
DCP_DIR = "dcp"  # sharded weights and optimizer of a multi-process run
PER_RANK = ("rng", "generator")  # each rank's own entries, unless a trainer names them (`rank_state`)
RANK_KEYS = "rank_keys"  # a sharded checkpoint's record of which entries those were
_NAME = re.compile(r"^checkpoint-(\d+)$")
# what a save killed midway leaves (`tirl.core.io.atomic_dir`, `atomic_write_*`: tempfile's 8 random characters,
# after the writer's `tirl-HOST-PID.` since those carry it): the staging directory of a checkpoint or the final
# model, the previous copy set aside while it was renamed in, and the temporary file of a metrics or config
# rewrite. Nothing else in a run directory is ever deleted by a run.
_STAGED = re.compile(
    r"^\.(checkpoint-\d+|model|metrics\.jsonl|samples\.jsonl|config\.yaml|curves\.json|curves\.png)\."
    r"(tirl-[0-9a-f]{6}-\d{1,7}\.)?[a-z0-9_]{8}\.tmp$"
)
_SET_ASIDE = re.compile(r"^\.(checkpoint-\d+|model)\.(tirl-[0-9a-f]{6}-\d{1,7}\.)?old$")
# what a trainer's run writes in its directory besides config.yaml (checkpoints: `_NAME`); `eval/step-<k>`: RL
# validation; curves: an RL run's last act (tirl.eval.curves)
_OUTPUTS = ("model", "metrics.jsonl", "samples.jsonl", "tensorboard", "curves.json", "curves.png")
_VALIDATION = re.compile(r"^step-\d+$")


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
    identity: (
        RunIdentity | None
    )  # the stage and settings its checkpoints record (set by the stage that runs it)

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


def rng_state() -> dict[str, Any]:
    """Every global generator the trainers draw from: Python, NumPy, torch CPU and (if present) CUDA."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


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
    """Write a complete checkpoint at `path` atomically; `state` is the trainer's (see module docstring), `identity`
    the stage and settings a resume must match (`tirl.train.manifest`).

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

        model_sd, optim_sd = get_state_dict(model, optimizer, options=_dcp_options(model))
        model_sd = _drop_frozen_aliases(model, model_sd)
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


def _dcp_options(model: torch.nn.Module) -> Any:
    """What goes into DCP: every weight, or for a LoRA model the adapter alone (its base is `model.path`'s,
    checked against the checkpoint's record of it when loading)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    adapter = lora.is_lora(model)
    return StateDictOptions(ignore_frozen_params=adapter, strict=not adapter)


def _drop_frozen_aliases(model: torch.nn.Module, state: dict[str, Any]) -> dict[str, Any]:
    """`ignore_frozen_params` drops a frozen parameter under its first name only: a tied LM head's second name
    stays (torch 2.13). For a LoRA model, drop it too, so that DCP holds exactly the adapter."""
    if not lora.is_lora(model):
        return state
    aliases = tied_aliases(model)
    return {k: v for k, v in state.items() if k not in aliases}


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
            raise CheckpointError(
                "this checkpoint was written by a single process; resume it in a single process (a sharded "
                "checkpoint, written under torchrun, resumes in any number of processes)"
            )
        optimizer.load_state_dict(state["optimizer"])
        return
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

    options = _dcp_options(model)
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
        options = _dcp_options(model)
        box = {"model": _drop_frozen_aliases(model, get_model_state_dict(model, options=options))}
        try:
            _dcp_load(box, Path(path))
        except Exception as e:
            raise CheckpointError(
                f"checkpoint {path}: {DCP_DIR}/ does not load ({type(e).__name__}: {e})"
            ) from None
        set_model_state_dict(model, box["model"], options=options)
        return
    if is_sharded(model):
        raise CheckpointError(
            f"checkpoint {path} was written by a single process; resume it in a single process (a sharded "
            "checkpoint, written under torchrun, resumes in any number of processes)"
        )
    from safetensors.torch import load_file

    if lora.is_lora(model) or lora.is_adapter_dir(path):
        try:
            lora.load_adapter_weights(model, path)
        except lora.LoraError as e:
            raise CheckpointError(str(e)) from None
        return

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


def complete_checkpoints(out_dir: str | Path) -> list[Path]:
    """`checkpoint-<step>` directories under `out_dir` with a manifest, oldest first."""
    found = []
    for p in Path(out_dir).glob("checkpoint-*"):
        m = _NAME.match(p.name)
        if m and p.is_dir() and (p / MANIFEST).is_file():
            found.append((int(m.group(1)), p))
    return [p for _, p in sorted(found)]


def resolve_resume(resume: str | None, out_dir: str | Path) -> Path | None:
    """`--resume DIR` -> DIR (verified); `--resume auto` -> the newest complete checkpoint in `out_dir`, or None for
    a fresh start; None/"" -> None."""
    if not resume:
        return None
    if resume == "auto":
        found = complete_checkpoints(out_dir)
        return found[-1] if found else None
    path = Path(resume)
    if not path.is_dir():
        raise CheckpointError(f"--resume {resume}: no such checkpoint directory")
    verify(path, hashes=False)  # load_state checks the hashes
    return path


def rotate(out_dir: str | Path, keep_last: int) -> list[Path]:
    """Delete the oldest complete checkpoints so that `keep_last` remain (0 = keep all); returns what was deleted.
    The newest complete checkpoint is never deleted, whatever `keep_last` says."""
    if not dist.is_main():  # under torchrun, rank 0 alone deletes
        return []
    found = complete_checkpoints(out_dir)
    if keep_last <= 0 or len(found) <= max(1, keep_last):
        return []
    doomed = found[: len(found) - max(1, keep_last)]
    for p in doomed:
        shutil.rmtree(p)
    return doomed


def clean_staging(out_dir: str | Path) -> list[str]:
    """Remove what saves killed midway left in `out_dir` (names matching tirl's own staging patterns only) and
    return the names. A set-aside previous copy whose replacement never arrived is put back, not deleted."""
    out = Path(out_dir)
    if not dist.is_main() or not out.is_dir():
        return []
    removed = []
    for p in sorted(out.iterdir()):
        if _STAGED.match(p.name):
            _remove(p)
            removed.append(p.name)
        elif (m := _SET_ASIDE.match(p.name)) and p.is_dir() and not p.is_symlink():
            target = out / m.group(1)
            if target.exists():
                shutil.rmtree(p)
                removed.append(p.name)
            else:  # killed between the two renames of atomic_dir: this is the only copy
                p.rename(target)
    return removed


def earlier_outputs(out_dir: str | Path) -> list[str]:
    """What an earlier training run left in `out_dir`: its checkpoints, final model, metrics and validation
    records (names relative to `out_dir`, checkpoints first)."""
    out = Path(out_dir)
    if not out.is_dir():
        return []
    found = [p.name for p in complete_checkpoints(out)]
    found += sorted(p.name for p in out.glob("checkpoint-*") if _NAME.match(p.name) and p.name not in found)
    found += [name for name in _OUTPUTS if (out / name).exists()]
    if (out / "eval").is_dir():
        found += [f"eval/{p.name}" for p in sorted((out / "eval").iterdir()) if _VALIDATION.match(p.name)]
    return found


def remove_outputs(out_dir: str | Path, names: list[str]) -> None:
    """Delete `names` (from `earlier_outputs`) under `out_dir`: a run told to start over there."""
    for name in names:
        _remove(Path(out_dir) / name)


def _remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p)
    else:
        p.unlink(missing_ok=True)
