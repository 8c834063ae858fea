"""`tirl demo`: the whole loop on a tiny model, on a CPU, in minutes.

1. Arithmetic problems (SFT, RL and held-out test sets) and scripted tool-using SFT trajectories whose tool outputs
   come from the real sandbox; a share of them imperfect (answer in the head, a failed first call, a miscopied
   answer).
2. A BPE tokenizer trained on that text and a ~2M-parameter Qwen2 model built from a config.
3. SFT, evaluation (n samples per test problem), GRPO-TCR, evaluation again.
4. A table of pass@1, pass@k, maj@k and tool use, SFT against RL, and `report.json`; then `tirl analyze` of the two
   evaluations (curves with intervals, crossover, solvable sets, audit, trajectory viewer) in `analysis/`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rich.table import Table

from tirl.chat.template import conversation_text, with_system
from tirl.commands.run_config import TirlConfig
from tirl.commands.stages import run_eval, run_sft, setup_torch
from tirl.core.config import save_config
from tirl.core.io import atomic_write_json
from tirl.core.logging import console
from tirl.data import write_rows
from tirl.demo.stages import (
    SFT_KEYS,
    DemoRows,
    Model,
    Stage,
    Stages,
    config_inputs,
    digest,
    every_weight,
    model_done,
    rows_input,
)
from tirl.eval.report import print_summary, run_analyze
from tirl.models.tiny import build_tiny
from tirl.sandbox import build_sandbox
from tirl.tasks import load_task


def _tokenizer_corpus(
    sft_rows: list[dict[str, Any]], prompt_rows: list[dict[str, Any]], system: str
) -> list[str]:
    """The text the tiny tokenizer is trained on: whole rendered conversations, so chat scaffolding compresses."""
    texts = [conversation_text(with_system(r["messages"], system)) for r in sft_rows]
    texts += [
        conversation_text(with_system(r["prompt"], system), add_generation_prompt=True) for r in prompt_rows
    ]
    return texts


def demo_rows(cfg: TirlConfig, out: Path) -> DemoRows:
    """The task's demo data (SFT trajectories through the sandbox, RL and test problems), written to `out`/data."""
    task = load_task(cfg.task.name)
    if task.training_data is None:
        raise ValueError(
            f"task {task.name!r} has no training data (Task.training_data): `tirl demo` needs SFT trajectories"
        )
    console.print(
        f"[bold]data[/] task {task.name!r}: SFT, RL and held-out test problems; SFT tool calls run in the sandbox"
    )
    with build_sandbox(cfg.sandbox) as sandbox:
        demo = task.training_data(cfg.task, cfg.seed, sandbox, cfg.agent.max_tool_response_chars)
    console.print(
        f"{len(demo.sft_rows)} SFT, {len(demo.rl_rows)} RL, {len(demo.test_rows)} held-out test problems"
    )
    data = out / "data"
    write_rows(data / "sft.jsonl", demo.sft_rows)
    write_rows(data / "rl.jsonl", demo.rl_rows)
    write_rows(data / "test.jsonl", demo.test_rows)
    write_rows(data / "warmup.jsonl", demo.warmup_rows)
    system = cfg.chat.system_prompt or task.system_prompt or ""
    return DemoRows(demo.sft_rows, demo.rl_rows, demo.test_rows, demo.warmup_rows, system)


def prepare(cfg: TirlConfig, out: Path) -> tuple[DemoRows, Model]:
    """The data and the initial tiny model (its fingerprint: what it was built from)."""
    data = demo_rows(cfg, out)
    corpus = _tokenizer_corpus(data.sft_rows, data.rl_rows + data.test_rows, data.system)
    corpus += [r["prompt"] + r["completion"] for r in data.warmup_rows]
    init = build_tiny(out / "model-init", corpus, cfg.demo.tiny, seed=cfg.seed)
    init_inputs = {**config_inputs(cfg, ("demo.tiny", "seed")), **rows_input("tokenizer corpus", corpus)}
    return data, Model(init, digest(init_inputs))


def sft_stage(cfg: TirlConfig, out: Path, data: DemoRows, init: Model) -> Stage:
    """What `train_sft_model`'s checkpoint (the warm-up's too) is made from (`tirl.demo.stages`)."""
    full = every_weight(cfg)
    inputs = {
        **config_inputs(full, (*SFT_KEYS, "demo.warmup")),
        "model init": init.fingerprint,
        **rows_input("sft rows", data.sft_rows),
        **rows_input("warm-up rows", data.warmup_rows),
    }
    return Stage("SFT", out / "sft" / "model", inputs)


def train_sft(run: Stages, data: DemoRows, init: Model, times: dict[str, float] | None = None) -> Model:
    """The copy warm-up and SFT from `init` into OUT/sft/model (`run.reuse`: unless made from the same inputs);
    adds it to `run.models` as `sft`."""
    stage = sft_stage(run.cfg, run.out, data, init)
    path = stage.output
    if not run.reusable(stage, model_done(path)):
        path = train_sft_model(run.cfg, run.out, data, init, {} if times is None else times)
        stage.record()
    run.models["sft"] = Model(path, stage.fingerprint)
    return run.models["sft"]


def train_sft_model(cfg: TirlConfig, out: Path, data: DemoRows, init: Model, times: dict[str, float]) -> Path:
    """The copy warm-up (if configured), then SFT on the scripted trajectories; returns the SFT checkpoint.

    Both train every weight, whatever model.lora says: an adapter on a model built from scratch has nothing to
    adapt, so `model.lora.rank > 0` in the demo applies to its RL stage only."""
    cfg = every_weight(cfg)
    t0 = time.time()
    start = init.path
    if cfg.demo.warmup.epochs:
        console.print(
            "[bold]warm-up[/]: the freshly built model learns to copy numbers (see tirl.tasks.arith.warmup)"
        )
        start = run_sft(
            cfg, out / "warmup", model_path=start, rows=data.warmup_rows, stage=cfg.demo.warmup, label="warm-up",
            restart=True,
        )  # fmt: skip
    times["warmup"] = time.time() - t0
    t0 = time.time()
    console.print("[bold]SFT[/] on the scripted trajectories (loss on assistant tokens only)")
    sft_model = run_sft(cfg, out / "sft", model_path=start, rows=data.sft_rows, restart=True)
    times["sft"] = time.time() - t0
    return sft_model


def run_demo(cfg: TirlConfig) -> dict[str, Any]:
    setup_torch(cfg)
    out = Path(cfg.out_dir)
    save_config(cfg, out / "config.yaml")
    times: dict[str, float] = {}
    t0 = time.time()
    data, init = prepare(cfg, out)
    times["prepare"] = time.time() - t0
    # every stage is redone, and recorded for `--compare`, which reuses the checkpoints
    run = Stages(cfg, out, reuse=False)
    sft = train_sft(run, data, init, times)

    t0 = time.time()
    sft_summary = run_eval(cfg, out / "eval-sft", model_path=sft.path, label="sft", rows=data.test_rows)
    times["eval_sft"] = time.time() - t0

    t0 = time.time()
    describe = f"[bold]RL[/] GRPO-TCR, {cfg.rl.steps} steps of {cfg.rl.prompts_per_step} prompts x {cfg.rl.n}"
    rl = run.train("rl", "rl", "sft", ("rl rows", data.rl_rows), cfg, describe, title="RL (rl)")
    times["rl"] = time.time() - t0

    t0 = time.time()
    rl_summary = run_eval(cfg, out / "eval-rl", model_path=rl.path, label="rl", rows=data.test_rows)
    times["eval_rl"] = time.time() - t0

    report = {
        "sft": _report_entry(sft_summary),
        "rl": _report_entry(rl_summary),
        "seconds": times,
        "eval": {"temperature": cfg.eval.temperature, "top_p": cfg.eval.top_p},
    }
    atomic_write_json(out / "report.json", report)  # before the analysis: its failure must not lose this
    print_report(report)
    console.print(
        f"report: {out / 'report.json'}  (records and trajectories in {out}/eval-sft, {out}/eval-rl)"
    )

    t0 = time.time()
    console.print(
        "[bold]analysis[/]: pass@k curves with bootstrap intervals, crossover, solvable sets, audit, viewer"
    )
    analysis = run_analyze([out / "eval-sft", out / "eval-rl"], out / "analysis", labels=["sft", "rl"])
    times["analyze"] = time.time() - t0
    report["analysis"] = str(out / "analysis" / "report.json")
    atomic_write_json(out / "report.json", report)
    print_summary(analysis, out / "analysis")
    return report


def _report_entry(summary: dict[str, dict[str, float]]) -> dict[str, Any]:
    s = summary.get("all") or next(iter(summary.values()))
    ks = sorted(int(k.split("@")[1]) for k in s if k.startswith("pass@"))
    return {
        "pass@1": s["pass@1"],
        "num_problems": int(s["num_problems"]),
        "samples_per_problem": int(s["samples_per_problem"]),
        "pass@k": {str(k): s[f"pass@{k}"] for k in ks},
        "maj@k": {str(k): s[f"maj@{k}"] for k in ks},
        "tool_calls_per_response": s["tool_calls_per_response"],
        "tool_error_rate": s["tool_error_rate"],
        "no_tool_share": s["no_tool_share"],
        "response_tokens": s["response_tokens"],
    }


def print_report(report: dict[str, Any]) -> None:
    sft, rl = report["sft"], report["rl"]
    table = Table(
        title=f"held-out test: {sft['num_problems']} problems x {sft['samples_per_problem']} samples"
    )
    table.add_column("metric")
    table.add_column("SFT", justify="right")
    table.add_column("RL", justify="right")
    table.add_column("RL - SFT", justify="right")
    rows = [(f"pass@{k}", sft["pass@k"][k], rl["pass@k"][k]) for k in sft["pass@k"]]
    rows += [(f"maj@{k}", sft["maj@k"][k], rl["maj@k"][k]) for k in sft["maj@k"] if k != "1"]
    for name, a, b in rows:
        table.add_row(name, f"{100 * a:.1f}%", f"{100 * b:.1f}%", f"{100 * (b - a):+.1f}")
    for key, label in (
        ("tool_calls_per_response", "tool calls / response"),
        ("no_tool_share", "answers without tool"),
        ("tool_error_rate", "tool error rate"),
    ):
        table.add_row(label, f"{sft[key]:.2f}", f"{rl[key]:.2f}", f"{rl[key] - sft[key]:+.2f}")
    console.print(table)
