"""Where a training run starts: the checkpoint `--resume` names (or `--resume auto` finds), checked against the
run's stage and settings, and what an earlier run left in the output directory.

A run that does not continue its directory's own checkpoints never mixes its steps with an earlier run's there: it
is refused, or with `--restart` the earlier outputs are deleted first. Resuming a checkpoint beside later ones of
the same run is refused too (a later `--resume auto` would take the abandoned run's newest).

Deliberately not here: saving and restoring a trainer (`tirl.train.checkpoint`), finding, rotating and deleting
checkpoints and outputs (`tirl.train.run_outputs`), and the output directory's marker and lock
(`tirl.core.rundir`). The stages call `resume_point` once, before any model loads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tirl.core.logging import console
from tirl.core.rundir import RunDirError
from tirl.train import dist, run_outputs
from tirl.train.checkpoint_read import load_state
from tirl.train.manifest import RunIdentity


def resume_point(
    resume: str | None, out: Path, identity: RunIdentity, kind: str, restart: bool = False
) -> tuple[Path | None, dict[str, Any] | None]:
    """The checkpoint `resume` names (None: a fresh start) and its trainer state
    (`tirl.train.checkpoint_read.load_state`), once it is checked to be `identity`'s stage with its settings.

    A run that does not continue `out`'s own checkpoints never mixes its steps with what an earlier run left there
    (checkpoints a later `--resume auto` would take, metrics): refused, or with `restart` deleted first. What saves
    killed midway left in `out` is removed either way (rank 0 does both)."""
    if restart and resume == "auto":
        raise ValueError("--restart starts over and --resume auto continues: choose one")
    ckpt = run_outputs.resolve_resume(resume, out)
    if ckpt is not None and resume != "auto":
        _refuse_later_checkpoints(resume, ckpt, out)
    if resume == "auto" and ckpt is None:
        console.print(f"--resume auto: no complete checkpoint in {out}; starting from step 0")
    continues = resume == "auto" or (ckpt is not None and ckpt.resolve().parent == out.resolve())
    if dist.is_main() and not continues and (left := run_outputs.earlier_outputs(out)):
        shown = ", ".join(left[:6]) + (f" and {len(left) - 6} more" if len(left) > 6 else "")
        if not restart:
            raise RunDirError(
                f"--out {out} holds an earlier tirl {kind} run ({shown}): continue it with --resume auto, start "
                f"over there with --restart (deletes them), or choose another --out"
            )
        run_outputs.remove_outputs(out, left)
        console.print(f"starting over in {out}: deleted the earlier run's {shown}", soft_wrap=True)
    if removed := run_outputs.clean_staging(out):
        console.print(f"removed what a killed save left in {out}: {', '.join(removed)}", soft_wrap=True)
    return ckpt, load_state(ckpt, identity) if ckpt else None


def _refuse_later_checkpoints(resume: str, ckpt: Path, out: Path) -> None:
    """Resuming `out`'s checkpoint-k while `out` holds later ones would mix two runs: a crash before the new run
    overwrites them, and a later `--resume auto` takes the abandoned run's newest."""
    found = [c.resolve() for c in run_outputs.complete_checkpoints(out)]
    if ckpt.resolve() in found and (later := found[found.index(ckpt.resolve()) + 1 :]):
        raise RunDirError(
            f"--resume {resume}: {out} also holds later checkpoints of the run ({', '.join(c.name for c in later)}), "
            "which a later --resume auto would take: move them out of it first, or continue the newest with "
            "--resume auto"
        )
