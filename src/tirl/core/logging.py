"""One metrics interface for every trainer: flat `/`-namespaced float dicts to JSONL, the console and trackers.

JSONL (`metrics.jsonl` in the run directory) is always written, as strict JSON: a non-finite value (a NaN loss) is
written as `null`, never as the bare `NaN` that strict parsers (jq, JavaScript, pandas' engines) refuse. TensorBoard
and wandb are used when named in `backends` and installed (imported lazily, a missing one is a clear error at
start-up, not a crash mid-run). Both JSONL files are appended to only as files of the run's own: a symbolic link
or a hard link in their place is refused (`tirl.core.io.open_append`).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from tirl.core.io import atomic_write_text, open_append

console = Console(highlight=False)

BACKENDS = ("console", "jsonl", "tensorboard", "wandb")


class MetricsLogger:
    def __init__(
        self,
        out_dir: str | Path,
        *,
        backends: Sequence[str] = ("console", "jsonl"),
        console_keys: Sequence[str] = (),
        run_name: str = "tirl",
        config: dict[str, Any] | None = None,
        resume_step: int | None = None,
        run_id: str | None = None,
    ):
        """`resume_step`: a resumed run continues at this step; what an earlier attempt logged from it on (after
        its last checkpoint) is dropped, so the run's history has no duplicated or missing steps. `run_id`: the
        wandb run to continue (saved in checkpoints as `self.run_id`)."""
        unknown = [b for b in backends if b not in BACKENDS]
        if unknown:
            raise ValueError(f"unknown logger backends {unknown}; valid: {list(BACKENDS)}")
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.backends = tuple(backends)
        self.console_keys = tuple(console_keys)
        if resume_step is not None and "jsonl" in backends:
            _truncate_jsonl(self.out_dir / "metrics.jsonl", resume_step)
            _truncate_jsonl(self.out_dir / "samples.jsonl", resume_step)
        self._jsonl = open_append(self.out_dir / "metrics.jsonl") if "jsonl" in backends else None
        self._tb = self._wandb = None
        if "tensorboard" in backends:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as e:
                raise RuntimeError("logger backend 'tensorboard' needs the tensorboard package") from e
            self._tb = SummaryWriter(str(self.out_dir / "tensorboard"), purge_step=resume_step)
        if "wandb" in backends:
            try:
                import wandb
            except ImportError as e:
                raise RuntimeError("logger backend 'wandb' needs the wandb package") from e
            self._wandb = wandb.init(
                project="tirl",
                name=run_name,
                config=config or {},
                dir=str(self.out_dir),
                id=run_id,
                resume="allow" if run_id else None,
            )
        self.run_id = self._wandb.id if self._wandb else None

    def log(self, metrics: dict[str, float], *, step: int) -> None:
        if self._jsonl:
            row = {"step": step, "time": time.time(), **{k: _finite_or_none(v) for k, v in metrics.items()}}
            self._jsonl.write(json.dumps(row, allow_nan=False) + "\n")
            self._jsonl.flush()
        if self._tb:
            for k, v in metrics.items():
                self._tb.add_scalar(k, v, step)
        if self._wandb:
            self._wandb.log(metrics, step=step)
        if "console" in self.backends and self.console_keys:
            shown = "  ".join(
                f"{k.split('/')[-1]}={metrics[k]:.3g}" for k in self.console_keys if k in metrics
            )
            console.print(f"[dim]step {step:>4}[/]  {shown}")

    def log_text(self, key: str, text: str, *, step: int) -> None:
        """A block of text for a step (sample trajectories, as TRL's log_completions): `samples.jsonl` next to the
        metrics, a TensorBoard text summary, a wandb table row."""
        if self._jsonl:
            with open_append(self.out_dir / "samples.jsonl") as f:
                f.write(json.dumps({"step": step, "key": key, "text": text}) + "\n")
        if self._tb:
            self._tb.add_text(key, f"```\n{text}\n```", step)
        if self._wandb:
            import wandb

            self._wandb.log({key: wandb.Table(columns=["step", "text"], data=[[step, text]])}, step=step)

    def close(self) -> None:
        if self._jsonl:
            self._jsonl.close()
        if self._tb:
            self._tb.close()
        if self._wandb:
            self._wandb.finish()


def _finite_or_none(value: Any) -> Any:
    """`value`, or None for a float NaN or infinity (JSON has no such numbers)."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


def _truncate_jsonl(path: Path, step: int) -> None:
    """Keep the lines of a metrics file logged before `step` (atomically; a torn last line is dropped too)."""
    if not (path.is_file() or path.is_symlink()):
        return
    open_append(path).close()  # a link or a second name is refused before it is read or replaced
    kept = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            if json.loads(line)["step"] < step:
                kept.append(line)
        except (ValueError, KeyError, TypeError):
            continue
    atomic_write_text(path, "".join(f"{line}\n" for line in kept))
