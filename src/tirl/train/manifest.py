"""A checkpoint's manifest: what makes a checkpoint trustworthy before a run resumes from it.

`manifest.json`, written last into the staged checkpoint, lists every file with its size and SHA-256 and records
the run's identity (`RunIdentity`): its stage (`sft` or `rl`) and the settings that must not change on resume
(the data's fingerprint, `rl.n`, prompts per step, the seed, ...). Checks, each naming what is wrong:
- before saving, every weight and optimizer tensor is finite (a NaN saved is a NaN resumed); while training, the
  trained weights after every step (`check_weights`: one read of each, one device sync) and at
  the end the last update (`check_last_update`), so that neither a checkpoint nor the final model holds weights
  that went non-finite;
- a save that fails in the OS (a full disk, a lost mount) says so in one line; the checkpoint being written is
  discarded whole and the earlier ones stay as they were (`tirl.core.io.atomic_dir`);
- on resume, files the manifest does not list (a `zz.safetensors` dropped in later) are refused: a checkpoint
  holds what was saved with it and nothing else, except Markdown notes (`*.md`, which no loader reads); loading
  reads only listed files;
- on resume, sizes then hashes, streamed in 4 MiB chunks, files in parallel threads (SHA-256 runs at about
  1.2 GB/s per core with the CPU's SHA instructions: a 7B model's 28 GB of fp32 weights and 56 GB of AdamW state
  take about a minute on 1 core, seconds on 8 when the disk reads that fast; a restart takes minutes anyway), then
  the identity: another stage is refused, a changed setting is refused naming both values unless the run allows
  changes (`--resume-allow-changes`).

Deliberately not here: what goes into the checkpoint (`tirl.train.checkpoint`) and signatures (the hash catches
damage, not tampering by someone who can rewrite the manifest too).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from tirl.core.errors import TirlError
from tirl.train import dist
from tirl.train.optim import NonFiniteError

MANIFEST = "manifest.json"
HASH = "sha256"
CHUNK = 4 << 20  # bytes read per hash update
NOTES = ".md"  # the one kind of file a checkpoint may hold unlisted: notes, read by no loader
STAGES = ("sft", "rl")


class CheckpointError(TirlError):
    """A checkpoint is missing, incomplete, damaged or from another run; the message names the file or setting."""


@dataclass(frozen=True)
class RunIdentity:
    """What a checkpoint must share with the run that resumes it.

    `settings`: name -> JSON value (`rl.n`, `data`, ...); `allow_changes`: the resuming run accepts different
    settings (a deliberate change: the message still lists them); the stage must always match."""

    stage: str
    settings: Mapping[str, Any] = field(default_factory=dict)
    allow_changes: bool = False

    def __post_init__(self) -> None:
        if self.stage not in STAGES:
            raise ValueError(f"RunIdentity.stage must be one of {STAGES}, got {self.stage!r}")
        json.dumps(dict(self.settings))  # settings are stored in the manifest: JSON values only


def data_fingerprint(rows: Sequence[Any]) -> str:
    """A short hash of the rows (content and order): another file, or the same file edited, gives another."""
    h = hashlib.sha256()
    for row in rows:
        h.update(json.dumps(row, sort_keys=True, ensure_ascii=False, default=str).encode("utf-8"))
        h.update(b"\n")
    return f"{len(rows)} rows, {HASH} {h.hexdigest()[:16]}"


def file_hash(path: Path) -> str:
    h = hashlib.new(HASH)
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _hashes(paths: list[Path]) -> list[str]:
    """Each file's hash, several files at once (hashlib releases the GIL on large updates: weight shards and
    optimizer state hash in parallel on as many cores, up to 8)."""
    with ThreadPoolExecutor(max_workers=max(1, min(8, len(paths), os.cpu_count() or 1))) as pool:
        return list(pool.map(file_hash, paths))


def write(stage: Path, identity: RunIdentity | None) -> None:
    """The manifest of the staged checkpoint directory `stage` (every file in it, hashed)."""
    paths = [p for p in sorted(stage.rglob("*")) if p.is_file()]
    files = {
        str(p.relative_to(stage)): {"size": p.stat().st_size, HASH: h}
        for p, h in zip(paths, _hashes(paths), strict=True)
    }
    meta = {} if identity is None else {"stage": identity.stage, "settings": dict(identity.settings)}
    (stage / MANIFEST).write_text(json.dumps({"files": files, **meta}, indent=1))


def read(path: Path) -> dict[str, Any]:
    manifest = path / MANIFEST
    if not manifest.is_file():
        raise CheckpointError(
            f"checkpoint {path}: no {MANIFEST} (incomplete, or not a tirl training checkpoint)"
        )
    try:
        data = json.loads(manifest.read_text())
        data["files"].items()
    except (ValueError, KeyError, AttributeError) as e:
        raise CheckpointError(f"checkpoint {path}: {MANIFEST} is unreadable ({e})") from None
    return data


def verify(path: str | Path, *, hashes: bool = True) -> dict[str, Any]:
    """The manifest of the checkpoint at `path`, after checking every file's size (and hash: `hashes`); raises
    `CheckpointError` naming the first missing or damaged file."""
    path = Path(path)
    data = read(path)
    entries = {name: e if isinstance(e, dict) else {"size": e} for name, e in data["files"].items()}
    extra = unlisted(path, entries)
    if extra:
        shown = ", ".join(extra[:5]) + (f" and {len(extra) - 5} more" if len(extra) > 5 else "")
        raise CheckpointError(
            f"checkpoint {path}: {shown} {'is' if len(extra) == 1 else 'are'} not in its {MANIFEST} (added after "
            "the checkpoint was saved; a checkpoint holds only what was saved with it): move "
            f"{'it' if len(extra) == 1 else 'them'} out of the checkpoint, then resume"
        )
    for name, e in entries.items():  # sizes first: a truncated file is found without reading the others
        f = path / name
        if not f.is_file():
            raise CheckpointError(f"checkpoint {path}: {name} is missing")
        if f.stat().st_size != e["size"]:
            raise CheckpointError(
                f"checkpoint {path}: {name} is damaged ({f.stat().st_size} bytes, expected {e['size']})"
            )
    named = [(name, e[HASH]) for name, e in entries.items() if hashes and HASH in e]
    for (name, want), got in zip(named, _hashes([path / n for n, _ in named]), strict=True):
        if got != want:
            raise CheckpointError(
                f"checkpoint {path}: {name} is damaged (its {HASH} differs from the manifest's; the file changed "
                "after it was saved): resume from an earlier checkpoint"
            )
    return data


def unlisted(path: Path, listed: Mapping[str, Any]) -> list[str]:
    """Files (and links) under the checkpoint at `path` that its manifest does not list, Markdown notes aside."""
    found = (str(p.relative_to(path)) for p in sorted(path.rglob("*")) if p.is_file() or p.is_symlink())
    return [n for n in found if n != MANIFEST and n not in listed and not n.endswith(NOTES)]


def check_identity(
    path: str | Path, manifest: Mapping[str, Any], state: Mapping[str, Any], run: RunIdentity
) -> None:
    """Refuse to resume `run` from the checkpoint at `path` if it is another stage's, or (unless the run allows
    changes) if a setting differs; each difference is named with both values."""
    # a manifest without a stage predates identities: only the RL trainer's state has a data order
    stage = manifest.get("stage") or ("rl" if "order" in state else "sft")
    if stage != run.stage:
        raise CheckpointError(
            f"checkpoint {path} was written by tirl {stage}, not tirl {run.stage}: resume it with "
            f"`tirl {stage} --resume`, or start tirl {run.stage} from its weights (model.path={path})"
        )
    saved = manifest.get("settings")
    if saved is None:
        return  # written before settings were recorded: nothing to compare
    now = json.loads(json.dumps(dict(run.settings)))  # as they would be stored
    changed = [f"{k}: {saved.get(k)!r} in the checkpoint, {now.get(k)!r} now" for k in sorted({*saved, *now})
               if saved.get(k) != now.get(k)]  # fmt: skip
    if changed and not run.allow_changes:
        raise CheckpointError(
            f"checkpoint {path} was written with other settings ({'; '.join(changed)}): resume with the run's "
            "settings, or pass --resume-allow-changes to continue with the new ones deliberately"
        )
    if changed and dist.is_main():
        print(f"resuming with changed settings (--resume-allow-changes): {'; '.join(changed)}")


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t  # a DTensor's own shard (FSDP)


def first_non_finite(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> str | None:
    """The name of the first weight or optimizer-state tensor (this rank's shard) holding a NaN or an infinity."""
    names = {}
    for name, p in model.named_parameters():
        if not torch.isfinite(_local(p.detach())).all():
            return f"weight {name}"
        names[p] = name
    for name, b in model.named_buffers():
        if b.is_floating_point() and not torch.isfinite(_local(b)).all():
            return f"buffer {name}"
    for p, entries in optimizer.state.items() if optimizer is not None else ():
        for key, t in entries.items():
            if isinstance(t, torch.Tensor) and t.is_floating_point() and not torch.isfinite(_local(t)).all():
                return f"optimizer state {key!r} of {names.get(p, 'an unnamed parameter')}"
    return None


def check_finite(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> None:
    """Refuse to save a checkpoint at `path` that holds a NaN or an infinity (collective when distributed)."""
    bad = first_non_finite(model, optimizer)
    if dist.any_rank(bad is not None):
        raise CheckpointError(
            f"checkpoint {path} not saved: {bad or 'a tensor on another rank'} holds NaN or infinite values; "
            "the earlier checkpoints are kept. Lower the learning rate or resume from an earlier checkpoint"
        )


def all_finite(tensors: Sequence[torch.Tensor]) -> bool:
    """Whether every floating-point tensor (this rank's shard) is free of NaN and infinities: each tensor's minimum
    and maximum (`aminmax`: one read, NaN-propagating, vectorized; 49 ms for 108 M fp32 weights on one CPU core,
    where `isfinite(t).all()` took 626 ms and an infinity-norm 1 s), then one check and one device sync."""
    local = [_local(t.detach()) for t in tensors if t.is_floating_point() and t.numel()]
    if not local:
        return True
    ends = [torch.stack(torch.aminmax(t)).float() for t in local]
    return bool(torch.stack(ends).isfinite().all())


def check_weights(model: torch.nn.Module, where: str) -> None:
    """Stop the run when an update left a trained weight NaN or infinite (collective when distributed): nothing
    after it can be trusted, and no checkpoint or final model is written from it."""
    trained = [p for p in model.parameters() if p.requires_grad]
    if dist.any_rank(not all_finite(trained)):
        bad = first_non_finite(model, None)
        raise NonFiniteError(
            f"{where}: {bad or 'a weight on another rank'} holds NaN or infinite values after the update; stopping "
            "without saving (the earlier checkpoints are kept). Lower the learning rate, or resume from an "
            "earlier checkpoint"
        )


def check_last_update(skipped_in_row: int, where: str) -> None:
    """Refuse to end a run whose last `skipped_in_row` updates were skipped as non-finite (`tirl.train.optim`):
    the weights gave a NaN loss or gradient, and a final model written from them would carry the problem on."""
    if dist.any_rank(skipped_in_row > 0):
        raise NonFiniteError(
            f"{where}: the loss or gradient norm went non-finite and the run's last {skipped_in_row} update(s) "
            "were skipped; the final model was not written (the checkpoints are kept). Lower the learning rate, "
            "check the data, or resume from an earlier checkpoint"
        )


@contextlib.contextmanager
def os_errors(path: Path) -> Iterator[None]:
    """Turn an OS failure while writing the checkpoint at `path` into one line that says what happened."""
    try:
        yield
    except OSError as e:
        raise CheckpointError(_failed(path, e.errno, f"{e.strerror or e} ({e.filename or path})")) from None
    except (
        Exception
    ) as e:  # torch's writer (RuntimeError) and safetensors' (SafetensorError) wrap the OS error
        text = str(e).lower()
        if not (_nearly_full(path) or any(w in text for w in ("write", "space", "storagefull", "os error"))):
            raise
        raise CheckpointError(_failed(path, None, str(e).splitlines()[0])) from None


def _failed(path: Path, code: int | None, what: str) -> str:
    full = code in (errno.ENOSPC, errno.EDQUOT) or _nearly_full(path)
    free = _free_bytes(path.parent)
    reason = f"no space left on the disk ({free or 0:,} bytes free)" if full else "the write failed"
    return (
        f"checkpoint {path} not saved: {reason}: {what}. The partial checkpoint was removed and the earlier ones "
        f"are intact; {'free space' if full else 'fix the cause'}, then resume with --resume auto"
    )


def _nearly_full(path: Path) -> bool:
    """Less than 64 MiB left where the checkpoint goes: the write most likely failed for lack of space (the
    torch writer's own message says only "unexpected pos")."""
    free = _free_bytes(path.parent)
    return free is not None and free < 64 << 20


def _free_bytes(where: Path) -> int | None:
    with contextlib.suppress(OSError):
        return shutil.disk_usage(where).free
    return None
