"""Which stage outputs a demo may reuse from OUT_DIR: each stage records what it was made from, and a rerun redoes a
stage whose inputs differ (and so every stage made from it, whose inputs hold its fingerprint).

A stage's inputs are named hashes: the resolved config sections it reads (`config rl`: every `rl.*` key), the rows
it trains, samples or evaluates on (`data rl rows`), and the model it starts from (`model sft`: the fingerprint of
the stage that made it; a model no stage made, SmolLM2's import, by its files' content). The record is
`OUTPUT.fingerprint.json` beside the stage's output (`sft/model.fingerprint.json`,
`eval-base/summary.fingerprint.json`, `data/sft-real.fingerprint.json`), written atomically once the stage has
finished and removed before it runs again, so an output a killed stage left is never taken for done. An output
without a record (written before records existed) is redone. The fingerprint a later stage names is the record's:
its inputs and when it was made, so a stage redone for any reason redoes every stage made from its output.

Deliberately not here: running the stages (the demos call them), and partial reuse: a stage whose inputs differ
in any way is redone whole.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tirl.core.config import to_dict
from tirl.core.io import atomic_write_json
from tirl.core.logging import console

# the config sections each kind of stage reads; `task.name` picks the system prompt and tools (the task's other
# options only shape the data, whose rows are inputs of their own)
TRAIN_KEYS = ("model", "chat", "seed", "task.name")
SFT_KEYS = (*TRAIN_KEYS, "sft")
SAMPLE_KEYS = (*TRAIN_KEYS, "agent", "rollout", "reward", "sandbox")
RL_KEYS = (*SAMPLE_KEYS, "rl")
EVAL_KEYS = (*SAMPLE_KEYS, "eval")
CHUNK = 1 << 20


def digest(value: Any) -> str:
    """A short hash of a JSON-able value (dict keys sorted)."""
    text = json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def config_inputs(cfg: Any, keys: Sequence[str]) -> dict[str, str]:
    """`config KEY` -> the hash of the resolved section (or value) at each dotted key of `cfg`."""
    inputs = {}
    for key in keys:
        value: Any = cfg
        for part in key.split("."):
            value = getattr(value, part)
        value = to_dict(value)
        if key == "model":  # where the model lives is not what it is: the model's own input says that
            value = {k: v for k, v in value.items() if k != "path"}
        inputs[f"config {key}"] = digest(value)
    return inputs


def every_weight(cfg: Any) -> Any:
    """`cfg` with `model.lora` off: the demos' SFT stages train every weight whatever `model.lora` says (an adapter
    is the RL stage's choice), and their inputs are read from the config they train with."""
    import dataclasses

    from tirl.models.lora import LoraConfig

    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, lora=LoraConfig()))


def rows_input(name: str, rows: Sequence[Any]) -> dict[str, str]:
    return {f"data {name}": digest(list(rows))}


def files_fingerprint(path: str | Path) -> str:
    """The hash of a directory's files, names and content (a model no stage made: the import)."""
    h = hashlib.sha256()
    for f in sorted(p for p in Path(path).iterdir() if p.is_file()):
        h.update(f.name.encode("utf-8") + b"\0")
        with open(f, "rb") as stream:
            while chunk := stream.read(CHUNK):
                h.update(chunk)
    return h.hexdigest()[:16]


def model_done(path: Path) -> bool:
    """A model directory a training stage finished (a full model or a LoRA adapter)."""
    return (path / "config.json").exists() or (path / "adapter_config.json").exists()


@dataclass(frozen=True)
class Stage:
    """One stage of a demo: its name on the console, its output, and its named input hashes."""

    name: str
    output: Path
    inputs: dict[str, str]

    @property
    def record_path(self) -> Path:
        return self.output.with_name(f"{self.output.stem}.fingerprint.json")

    @property
    def fingerprint(self) -> str:
        """What the stages made from this one's output name as its input, once it was reused or recorded: its
        inputs and when it was made, so that a stage redone (with the same inputs or not) redoes them too."""
        record = _read_record(self.record_path)
        if record is None or not isinstance(record.get("fingerprint"), str):
            raise ValueError(f"{self.name}: {self.record_path} is missing; the stage has not finished")
        return record["fingerprint"]

    def reusable(self, done: bool) -> bool:
        """Whether the stage's output (`done`: it is there) was made from these inputs; when not, says which stage
        is redone and which inputs changed (an output is there) and removes the old record."""
        if done:
            recorded = (_read_record(self.record_path) or {}).get("inputs")
            if recorded == self.inputs:
                console.print(
                    f"[bold]{self.name}[/]: reusing {self.output} (same inputs; delete it to redo)",
                    soft_wrap=True,
                )
                return True
            if not isinstance(recorded, dict):
                why = "no record of its inputs"
            else:
                keys = sorted(self.inputs.keys() | recorded.keys())
                why = "changed: " + ", ".join(k for k in keys if self.inputs.get(k) != recorded.get(k))
            console.print(
                f"[bold]{self.name}[/]: redoing it, {self.output} was made from other inputs ({why})",
                soft_wrap=True,
            )
        self.forget()
        return False

    def forget(self) -> None:
        """Remove the record before the stage runs: a run killed midway leaves an output without one."""
        self.record_path.unlink(missing_ok=True)

    def record(self) -> None:
        """Once the stage has finished: what its output was made from."""
        made = time.time_ns()
        fingerprint = digest({"inputs": self.inputs, "made_ns": made})
        atomic_write_json(
            self.record_path, {"fingerprint": fingerprint, "made_ns": made, "inputs": self.inputs}
        )


def _read_record(path: Path) -> dict[str, Any] | None:
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None
