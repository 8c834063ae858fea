"""The stages of one arm and seed on the tiny demo: its data and SFT model (shared by the arms of a seed, or the
arm's own), its RL run and its evaluation; each reused when its output was made from the same inputs
(`tirl.demo.reuse`), so an interrupted comparison resumes where it stopped and a changed arm is redone.

The records and names are the tiny demo's own (`tirl.demo.tiny`: `sft_stage`, and RL's inputs as `rl_stage` has
them), so a comparison can reuse the checkpoints `tirl demo` left (`tirl demo --compare`). RL and evaluation
read only a `Start`'s rows and model, so the SmolLM2 stages (`smollm2_stages`) use them too and differ only in how a
start is made. Not here: which arm shares which SFT model, or what happens when a stage fails (`runner`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tirl.commands.run_config import TirlConfig
from tirl.commands.stages import run_eval, run_rl
from tirl.core.logging import console
from tirl.demo import tiny
from tirl.demo.reuse import EVAL_KEYS, RL_KEYS, Stage, config_inputs, every_weight, model_done, rows_input

# the config sections an SFT model of the tiny demo is made from, data included: arms that agree on them share it
SFT_SOURCES = ("model", "chat", "seed", "task", "sandbox", "sft")


@dataclass(frozen=True)
class Start:
    """A seed's data and SFT model: what the arms starting from it train RL from and are evaluated on."""

    prep: dict[str, Any]  # `tiny.prepare`'s rows and initial model
    sft: Path
    sft_fingerprint: str


def sft_sources(cfg: TirlConfig) -> dict[str, str]:
    """What decides an SFT model (and its data): two configs that agree here make the same one. The tiny demo's
    SFT trains every weight whatever `model.lora` says (`tiny.train_sft_model`), so LoRA is left out."""
    full = every_weight(cfg)
    return config_inputs(full, SFT_SOURCES)


def prepare_start(cfg: TirlConfig, out: Path) -> Start:
    """Data, the initial model and SFT into `out` (out/data, out/sft/model, ...), SFT reused when made from the
    same inputs."""
    prep = tiny.prepare(cfg, out)
    stage = tiny.sft_stage(cfg, out, prep)
    path = stage.output
    if not stage.reusable(model_done(path)):
        path = tiny.train_sft_model(cfg, out, prep, {})
        stage.record()
    return Start(prep, Path(path), stage.fingerprint)


def data_start(cfg: TirlConfig, out: Path, source: str, shared: Start) -> Start:
    """An arm's start on other SFT rows (`Arm.sft_data`): the tiny demo has no other source of them."""
    raise ValueError(
        f"SFT data {source!r}: the tiny demo's stages have none (the smollm2 stages have 'sampled')"
    )


def train_rl(cfg: TirlConfig, out: Path, start: Start) -> tuple[Path, str]:
    """RL from the start's SFT model into `out` (out/model), reused when made from the same inputs; returns the
    model and its fingerprint."""
    inputs = {
        **config_inputs(cfg, RL_KEYS),
        "model sft": start.sft_fingerprint,
        **rows_input("rl rows", start.prep["rl_rows"]),
    }  # `tiny.rl_stage`'s inputs: a demo's RL checkpoint of the same settings is reused
    stage = Stage(f"RL ({out.name})", out / "model", inputs)
    if not stage.reusable(model_done(stage.output)):
        rl = cfg.rl
        console.print(
            f"[bold]RL[/] {out.name}: {rl.advantage.name}, {rl.steps} steps of {rl.prompts_per_step} prompts x "
            f"{rl.n}, seed {cfg.seed}"
        )
        run_rl(cfg, out, model_path=start.sft, rows=start.prep["rl_rows"], restart=True)
        stage.record()
    return stage.output, stage.fingerprint


def evaluate(cfg: TirlConfig, out: Path, model: tuple[Path, str], label: str, start: Start) -> dict[str, Any]:
    """The model's evaluation on the start's held-out rows into `out`, reused when made from the same inputs;
    returns its summary."""
    path, fingerprint = model
    rows = start.prep["test_rows"]
    inputs = {**config_inputs(cfg, EVAL_KEYS), f"model {label}": fingerprint, **rows_input("test rows", rows)}
    stage = Stage(f"eval {label}", out / "summary.json", inputs)
    if stage.reusable(stage.output.is_file()):
        return json.loads(stage.output.read_text(encoding="utf-8"))
    temps = cfg.eval.all_temperatures
    console.print(f"[bold]eval[/] {label}: {len(rows)} problems x {cfg.eval.n} at T={temps}")
    summary = run_eval(cfg, out, model_path=path, label=label, rows=rows)
    stage.record()
    return summary
