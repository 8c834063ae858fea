"""What a training run keeps in its output directory: its complete checkpoints (found, picked for `--resume`,
rotated), the leftovers of saves killed midway, and what an earlier run left there.

Rotation (`keep_last`) deletes the oldest complete checkpoints, never the newest complete one. A process killed
while saving (SIGKILL, a lost node) leaves its staging directory behind; the next run into the directory removes
such leftovers of its own saves, and only those (`clean_staging`). A run that does not continue the directory's
checkpoints refuses to mix its steps with an earlier run's (`earlier_outputs`), unless told to start over there
(`remove_outputs`). Under torchrun, rank 0 alone deletes.

Not here: a checkpoint's own files (`tirl.train.checkpoint_write`, `tirl.train.checkpoint_read`), the decision to
resume or start over (`tirl.train.resume`), the directory's marker and lock (`tirl.core.rundir`).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from tirl.train import dist
from tirl.train.checkpoint_read import verify
from tirl.train.manifest import MANIFEST, CheckpointError

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
