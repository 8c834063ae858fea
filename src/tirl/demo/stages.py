"""The one stage runner of the demos (the tiny demo, the SmolLM2 and GSM8K runs, the GSM8K study, the comparisons):
what each stage hands the next (`DemoRows`, `Model`), and which stage outputs a rerun may reuse from OUT_DIR.

Each stage records what it was made from, and a rerun redoes a stage whose inputs differ (and so every stage made
from it, whose inputs hold its fingerprint). A stage's inputs are named hashes: the resolved config sections it reads
(`config rl`: every `rl.*` key), the rows it trains, samples or evaluates on (`data rl rows`), and the model it
starts from (`model sft`: the fingerprint of the stage that made it; a model no stage made, SmolLM2's import, by its
files' content). The record is `OUTPUT.fingerprint.json` beside the stage's output (`sft/model.fingerprint.json`,
`eval-base/summary.fingerprint.json`, `data/sft-real.fingerprint.json`), written atomically once the stage has
finished and removed before it runs again, so an output a killed stage left is never taken for done. An output
without a record (written before records existed) is redone. The fingerprint a later stage names is the record's:
its inputs and when it was made, so a stage redone for any reason redoes every stage made from its output.

A training stage run with `resumable=True` also leaves `LABEL.started.json` (its inputs) while it runs: a run
stopped midway continues from the stage's newest checkpoint when started again with the same inputs.

`Stages(..., reuse=False)` (the tiny demo) redoes every stage and still records it, so that `tirl demo --compare`
reuses what the demo trained. Deliberately not here: which stages a demo chains (each demo's module), and partial
reuse: a stage whose inputs differ in any way is redone whole.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import resource
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from tirl.commands.run_config import TirlConfig
from tirl.commands.stages import run_eval, run_rl, run_sft
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
T = TypeVar("T")
Rows = list[dict[str, Any]]


@dataclass(frozen=True)
class DemoRows:
    """The demo's data (`tirl.demo.tiny.demo_rows`): SFT conversations, RL and held-out prompts, warm-up rows, and
    the system prompt they are rendered with."""

    sft_rows: Rows
    rl_rows: Rows
    test_rows: Rows
    warmup_rows: Rows
    system: str = ""


@dataclass(frozen=True)
class Model:
    """A model a stage made (or the import): its directory and the fingerprint the stages made from it name."""

    path: Path
    fingerprint: str


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


def every_weight(cfg: TirlConfig) -> TirlConfig:
    """`cfg` with `model.lora` off: the demos' SFT stages train every weight whatever `model.lora` says (an adapter
    is the RL stage's choice), and their inputs are read from the config they train with."""
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
    """One stage: its name on the console, its output, and its named input hashes."""

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
        record = _read_json(self.record_path)
        if not isinstance(record, dict) or not isinstance(record.get("fingerprint"), str):
            raise ValueError(f"{self.name}: {self.record_path} is missing; the stage has not finished")
        return record["fingerprint"]

    def reusable(self, done: bool) -> bool:
        """Whether the stage's output (`done`: it is there) was made from these inputs; when not, says which stage
        is redone and which inputs changed (an output is there) and removes the old record."""
        if done:
            record = _read_json(self.record_path)
            recorded = record.get("inputs") if isinstance(record, dict) else None
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


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def cpu_seconds() -> float:
    """User and system seconds of this process and of every child it has waited for (the vLLM server, sandbox
    workers): a stage's CPU cost, which another job on the machine changes far less than its wall time."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def earlier_times(report: Path) -> dict[str, float]:
    """Stage seconds of the report an earlier run left in OUT_DIR (none when there is none or it is unreadable)."""
    record = _read_json(report)
    seconds = record.get("seconds") if isinstance(record, dict) else None
    if not isinstance(seconds, dict):
        return {}
    return {k: v for k, v in seconds.items() if isinstance(v, int | float)}


def resume_point(started: Path, inputs: dict[str, str]) -> str | None:
    """ "auto" (the stage's newest checkpoint) when an earlier run started the stage with the same inputs, else
    None (a fresh start); records these inputs as started."""
    same = _read_json(started) == inputs
    atomic_write_json(started, inputs)
    if same:
        console.print(f"[dim]{started.name}: the same inputs; continuing from the newest checkpoint[/]")
    return "auto" if same else None


@dataclass
class Stages:
    """The stages of one run in `out`: the models made so far (label -> `Model`), each stage's seconds (`times`;
    None: not timed) and the report the evaluations go into (`report`, saved as OUT/report.json after each; None:
    none). `reuse`: a stage made from the same inputs is reused (False: every stage is redone, and recorded)."""

    cfg: TirlConfig
    out: Path
    report: dict[str, Any] | None = None
    times: dict[str, float] | None = None
    models: dict[str, Model] = field(default_factory=dict)
    reuse: bool = True

    def save(self) -> None:
        if self.report is not None:
            atomic_write_json(self.out / "report.json", self.report)

    def timed(self, name: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """`fn(*args, **kwargs)`, its wall seconds put in `times[name]` and its CPU seconds in `times[name + " cpu"]`."""
        if self.times is None:
            return fn(*args, **kwargs)
        t0, c0 = time.time(), cpu_seconds()
        out = fn(*args, **kwargs)
        self.times[name] = round(time.time() - t0, 1)
        self.times[f"{name} cpu"] = round(cpu_seconds() - c0, 1)
        console.print(f"[dim]{name}: {self.times[name]:.0f} s ({self.times[f'{name} cpu']:.0f} CPU s)[/]")
        return out

    def reusable(self, stage: Stage, done: bool) -> bool:
        """Whether `stage`'s output is there and made from its inputs (never, without `reuse`); when not, its old
        record is removed."""
        if self.reuse:
            return stage.reusable(done)
        stage.forget()
        return False

    def train(
        self,
        label: str,
        kind: str,
        start: str,
        rows: tuple[str, Rows],
        cfg: TirlConfig,
        describe: str,
        *,
        model: Model | None = None,
        title: str = "",
        resumable: bool = False,
    ) -> Model:
        """SFT or RL (`kind`) with `cfg` from model `start` (`model`, else the one made under that label) on `rows`
        (their input's name, the rows) into OUT/label/model, unless the model there was made from the same inputs;
        adds it to `models`. `title`: the stage's name on the console (default `label`). `resumable`: a stage a run
        stopped midway continues from its newest checkpoint when its inputs are the same (`cfg` must save
        checkpoints)."""
        rows_name, data = rows
        source = model or self.models[start]
        inputs = {
            **config_inputs(cfg, SFT_KEYS if kind == "sft" else RL_KEYS),
            f"model {start}": source.fingerprint,
            **rows_input(rows_name, data),
        }
        stage = Stage(title or label, self.out / label / "model", inputs)
        path = stage.output
        if not self.reusable(stage, model_done(path)):
            console.print(describe)
            started = self.out / f"{label}.started.json"
            resume = resume_point(started, inputs) if resumable else None
            if resume is not None and self.report is not None:  # its seconds: the part after the checkpoint
                self.report.setdefault("continued_from_checkpoint", []).append(label)
            fn = run_sft if kind == "sft" else run_rl
            how = {"model_path": source.path, "rows": data, "resume": resume, "restart": resume is None}
            path = self.timed(label, fn, cfg, self.out / label, **how)
            stage.record()
            started.unlink(missing_ok=True)
        self.models[label] = Model(path, stage.fingerprint)
        return self.models[label]

    def evaluate(
        self,
        label: str,
        rows: tuple[str, Rows],
        cfg: TirlConfig,
        *,
        name: str = "",
        model: Model | None = None,
    ) -> dict[str, Any]:
        """Model `label` (`model`, else the one made under that label) evaluated with `cfg` on `rows` into
        OUT/eval-`name` (default `label`), reused when made from the same inputs; the summary goes into the report
        under `name`."""
        rows_name, data = rows
        name = name or label
        source = model or self.models[label]
        inputs = {
            **config_inputs(cfg, EVAL_KEYS),
            f"model {label}": source.fingerprint,
            **rows_input(rows_name, data),
        }
        out = self.out / f"eval-{name}"
        stage = Stage(f"eval {name}", out / "summary.json", inputs)
        if self.reusable(stage, stage.output.is_file()):
            summary = json.loads(stage.output.read_text(encoding="utf-8"))
        else:
            temps = cfg.eval.all_temperatures
            console.print(
                f"[bold]eval[/] {name}: {label} on {len(data)} {rows_name} x {cfg.eval.n} at T={temps}"
            )
            summary = self.timed(
                f"eval_{name}", run_eval, cfg, out, model_path=source.path, label=name, rows=data
            )
            stage.record()
        if self.report is not None:
            self.report["summary"][name] = summary
            self.save()
        return summary
