"""Training checkpoints that a run can resume from exactly: written whole or not at all, verified when read.

A checkpoint `checkpoint-<step>/` is a Hugging Face model directory (weights, config, tokenizer; for LoRA the
adapter and `base_model.json`, see `tirl.models.lora`) plus
`trainer_state.pt` (optimizer, scheduler, counters, data order, every random generator, what the trainer needs
next) and `manifest.json`, written last, listing every file with its size. The directory is staged and renamed in
one step (`tirl.io.atomic_dir`), so a crash leaves either the whole checkpoint or none; the manifest also catches
files damaged later (truncated, deleted), and loading names the bad file.

Rotation (`keep_last`) deletes the oldest complete checkpoints, never the newest complete one.
"""

from __future__ import annotations

import json
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tirl.errors import TirlError
from tirl.io import atomic_dir
from tirl.models import lora

MANIFEST = "manifest.json"
STATE = "trainer_state.pt"
_NAME = re.compile(r"^checkpoint-(\d+)$")


class CheckpointError(TirlError):
    """A checkpoint is missing, incomplete or damaged; the message names the file."""


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


def save(path: str | Path, *, model: torch.nn.Module, tokenizer: Any, state: dict[str, Any]) -> Path:
    """Write a complete checkpoint at `path` atomically; `state` is the trainer's (see module docstring)."""
    with atomic_dir(path) as stage:
        lora.save_model(model, stage)  # a LoRA model: its adapter and the record of its base
        tokenizer.save_pretrained(stage)
        torch.save({**state, "rng": rng_state()}, stage / STATE)
        files = {str(p.relative_to(stage)): p.stat().st_size for p in sorted(stage.rglob("*")) if p.is_file()}
        (stage / MANIFEST).write_text(json.dumps({"files": files}, indent=1))
    return Path(path)


def verify(path: str | Path) -> None:
    """Raise `CheckpointError` naming the first missing or damaged file of the checkpoint at `path`."""
    path = Path(path)
    manifest = path / MANIFEST
    if not manifest.is_file():
        raise CheckpointError(
            f"checkpoint {path}: no {MANIFEST} (incomplete, or not a tirl training checkpoint)"
        )
    try:
        files = json.loads(manifest.read_text())["files"]
    except (ValueError, KeyError) as e:
        raise CheckpointError(f"checkpoint {path}: {MANIFEST} is unreadable ({e})") from None
    for name, size in files.items():
        f = path / name
        if not f.is_file():
            raise CheckpointError(f"checkpoint {path}: {name} is missing")
        if f.stat().st_size != size:
            raise CheckpointError(
                f"checkpoint {path}: {name} is damaged ({f.stat().st_size} bytes, expected {size})"
            )


def load_state(path: str | Path) -> dict[str, Any]:
    """The trainer state of a verified checkpoint (the weights are read by the caller with `load_weights`)."""
    verify(path)
    try:
        return torch.load(Path(path) / STATE, weights_only=False)
    except Exception as e:  # a file of the right size that torch cannot read
        raise CheckpointError(f"checkpoint {path}: {STATE} is corrupt ({type(e).__name__}: {e})") from None


def load_weights(model: torch.nn.Module, path: str | Path) -> None:
    """Load the checkpoint's weights into `model` in place (same architecture), naming the file on failure.
    A LoRA model takes the checkpoint's adapter, after checking that it was trained on the same base."""
    from safetensors.torch import load_file

    if lora.is_lora(model) or lora.is_adapter_dir(path):
        try:
            lora.load_adapter_weights(model, path)
        except lora.LoraError as e:
            raise CheckpointError(str(e)) from None
        return

    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"checkpoint {path}: no *.safetensors weights")
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
    verify(path)
    return path


def rotate(out_dir: str | Path, keep_last: int) -> list[Path]:
    """Delete the oldest complete checkpoints so that `keep_last` remain (0 = keep all); returns what was deleted.
    The newest complete checkpoint is never deleted, whatever `keep_last` says."""
    found = complete_checkpoints(out_dir)
    if keep_last <= 0 or len(found) <= max(1, keep_last):
        return []
    doomed = found[: len(found) - max(1, keep_last)]
    for p in doomed:
        shutil.rmtree(p)
    return doomed
