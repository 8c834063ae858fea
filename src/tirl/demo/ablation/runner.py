"""The loop of a comparison: seed by seed, arm by arm, one after another (each stage already uses every core of a
small machine). Per seed, the data and SFT model of the base config are made once, lazily, and shared by every arm
whose SFT settings are the base's (`--start sft`); an arm that changes them (or every arm, `--start init`) makes
its own in `seed-<s>/sft-<arm>/`. Each arm then trains RL and is evaluated, then the seed's evaluations are analysed
together (`tirl analyze`, the baseline first).

An arm that fails, a bad override or a crash, is recorded with its error (`ArmRun`) and the others go on; a stop
request (`StopRequested`) or Ctrl-C ends the comparison, and a rerun resumes it: every finished stage is reused
(`tirl.demo.stages`). A start is made the tiny demo's way or SmolLM2's, as the study names it (`starts.STAGE_SETS`);
an arm's RL and evaluation read only the start's rows and model (`train_rl`, `evaluate`). Not here: the numbers
across seeds (`summary`).
"""

from __future__ import annotations

import dataclasses
import os
import time
import traceback
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tirl.commands.run_config import TirlConfig
from tirl.core.io import atomic_write_json
from tirl.core.logging import console
from tirl.demo.ablation.arms import START_LABEL, Arm, Study, arm_config
from tirl.demo.ablation.starts import STAGE_SETS, Start, TinyStarts, sft_sources
from tirl.demo.stages import Model, Stages
from tirl.eval.report import print_summary, run_analyze
from tirl.train.signals import StopRequested


@dataclass(frozen=True)
class Layout:
    """Where a comparison writes. By default everything of seed s under `root/seed-<s>/`; `train_root` puts the
    training stages of a one-seed comparison in an existing demo directory instead (its sft/ and rl/ reused), the
    evaluations and analysis in `root`; `rl_dirs` names an arm's RL directory (default `rl-<arm>`)."""

    root: Path
    train_root: Path | None = None
    rl_dirs: Mapping[str, str] = field(default_factory=dict)

    def train_dir(self, seed: int) -> Path:
        return self.train_root or self.root / f"seed-{seed}"

    def eval_dir(self, seed: int) -> Path:
        return self.root if self.train_root else self.root / f"seed-{seed}"

    def rl_dir(self, seed: int, arm: str) -> Path:
        return self.train_dir(seed) / self.rl_dirs.get(arm, f"rl-{arm}")


@dataclass(frozen=True)
class ArmRun:
    """One arm and seed, as the comparison left it: done (its RL run and evaluation) or failed (the error)."""

    arm: str
    seed: int
    status: str  # done | failed
    error: str = ""
    rl_dir: str = ""
    eval_dir: str = ""
    own_sft: bool = False  # trained its own SFT model rather than the seed's shared one
    seconds: float = 0.0


def train_rl(cfg: TirlConfig, out: Path, start: Start) -> Model:
    """RL from the start's SFT model into `out`/model, reused when made from the same inputs (a demo's RL record:
    its `rl/` of the same settings is reused)."""
    rl = cfg.rl
    describe = (
        f"[bold]RL[/] {out.name}: {rl.advantage.name}, {rl.steps} steps of {rl.prompts_per_step} prompts x "
        f"{rl.n}, seed {cfg.seed}"
    )
    rows = ("rl rows", start.data.rl_rows)
    return Stages(cfg, out.parent).train(
        out.name, "rl", "sft", rows, cfg, describe, model=start.sft, title=f"RL ({out.name})"
    )


def evaluate(cfg: TirlConfig, root: Path, model: Model, label: str, start: Start) -> dict[str, Any]:
    """The model's evaluation on the start's held-out rows into `root`/eval-`label`, reused when made from the
    same inputs; returns its summary."""
    rows = ("test rows", start.data.test_rows)
    return Stages(cfg, root).evaluate(label, rows, cfg, model=model)


class _Shared:
    """A seed's shared data and SFT model (of the base config, in `out`), made on first use; a failure is kept and
    given to every arm asking."""

    def __init__(self, cfg: TirlConfig, out: Path, starts: TinyStarts) -> None:
        self.cfg, self.out, self.starts = cfg, out, starts
        self._start: Start | None = None
        self._error = ""

    def get(self) -> Start:
        if self._error:
            raise RuntimeError(f"the seed's shared SFT failed: {self._error}")
        if self._start is None:
            try:
                self._start = self.starts.start(self.cfg, self.out)
            except StopRequested:
                raise
            except Exception as e:
                self._error = _describe(e)
                raise
        return self._start


def _describe(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


def arm_configs(base: TirlConfig, study: Study) -> dict[str, TirlConfig | str]:
    """Each arm's config, or its error (a bad override fails that arm alone, at once, for every seed)."""
    out: dict[str, TirlConfig | str] = {}
    for arm in study.arms:
        try:
            out[arm.name] = arm_config(base, arm)
        except ValueError as e:  # ConfigError is one
            out[arm.name] = str(e)
    return out


def _seeded(cfg: TirlConfig, seed: int) -> TirlConfig:
    return dataclasses.replace(cfg, seed=seed)


def _run_arm(arm: Arm, cfg: TirlConfig, seed: int, study: Study, shared: _Shared, layout: Layout) -> ArmRun:
    t0 = time.time()
    own_dir = layout.train_dir(seed) / f"sft-{arm.name}"
    own = study.start == "init" or bool(arm.sft_data) or sft_sources(cfg) != sft_sources(shared.cfg)
    if arm.sft_data:  # its rows come from the shared start (the sampled ones: from its SFT model)
        console.print(f"[bold]{arm.name}[/]: its own SFT model, on the {arm.sft_data} SFT rows")
        start = shared.starts.data_start(cfg, own_dir, arm.sft_data, shared.get())
    elif own:
        console.print(
            f"[bold]{arm.name}[/]: its own SFT model (its SFT settings or data differ, or --start init)"
        )
        start = shared.starts.start(cfg, own_dir)
    else:
        start = shared.get()
    rl_dir = ""
    model = start.sft  # --train sft: the arms' SFT models are what is compared
    if study.train != "sft":
        model = train_rl(cfg, layout.rl_dir(seed, arm.name), start)
        rl_dir = str(layout.rl_dir(seed, arm.name))
    evaluate(cfg, layout.eval_dir(seed), model, arm.name, start)
    eval_dir = layout.eval_dir(seed) / f"eval-{arm.name}"
    return ArmRun(arm.name, seed, "done", "", rl_dir, str(eval_dir), own, round(time.time() - t0, 1))


def _run_seed(
    base: TirlConfig, configs: dict[str, TirlConfig | str], seed: int, study: Study, layout: Layout
) -> list[ArmRun]:
    seed_base = _seeded(base, seed)
    shared = _Shared(seed_base, layout.train_dir(seed), STAGE_SETS[study.stages]())
    runs: list[ArmRun] = []
    labels: list[str] = []
    if study.evaluate_start:
        try:
            start = shared.get()
            evaluate(seed_base, layout.eval_dir(seed), start.sft, START_LABEL, start)
            labels.append(START_LABEL)
        except StopRequested:
            raise
        except Exception as e:
            console.print(
                f"[bold red]the shared SFT model of seed {seed} or its evaluation failed[/]: {_describe(e)}",
                soft_wrap=True,
            )
    for arm in study.arms:
        cfg = configs[arm.name]
        if isinstance(cfg, str):
            runs.append(ArmRun(arm.name, seed, "failed", cfg))
            continue
        console.rule(f"seed {seed}, arm {arm.name}")
        try:
            runs.append(_run_arm(arm, _seeded(cfg, seed), seed, study, shared, layout))
            labels.append(arm.name)
        except StopRequested:
            raise
        except Exception as e:
            console.print(f"[bold red]arm {arm.name}, seed {seed} failed[/]: {_describe(e)}", soft_wrap=True)
            if os.environ.get("TIRL_DEBUG"):
                console.print(traceback.format_exc(), markup=False, highlight=False)
            runs.append(ArmRun(arm.name, seed, "failed", _describe(e)))
    _analyze_seed(layout.eval_dir(seed), labels, study)
    return runs


def _analyze_seed(eval_root: Path, labels: list[str], study: Study) -> None:
    """`tirl analyze` over the seed's evaluations (the baseline first: every comparison is against it)."""
    base = START_LABEL if START_LABEL in labels else study.baseline_arm
    if base not in labels:
        return
    ordered = [base, *(x for x in labels if x != base)]
    try:
        report = run_analyze(
            [eval_root / f"eval-{x}" for x in ordered], eval_root / "analysis", labels=ordered
        )
        print_summary(report, eval_root / "analysis")
    except StopRequested:
        raise
    except Exception as e:  # the numbers of the comparison do not depend on it
        console.print(f"[bold red]analysis of {eval_root} failed[/]: {_describe(e)}")


def run_arms(base: TirlConfig, study: Study, layout: Layout) -> list[ArmRun]:
    """Every arm for seeds base.seed .. base.seed + study.seeds - 1; `runs.json` in the root after each seed."""
    if layout.train_root is not None and study.seeds > 1:
        raise ValueError(
            f"{layout.train_root} holds one seed's training stages; {study.seeds} seeds need their own"
        )
    configs = arm_configs(base, study)
    for name, cfg in configs.items():
        if isinstance(cfg, str):
            console.print(f"[bold red]arm {name} cannot run[/]: {cfg}")
    runs: list[ArmRun] = []
    for i in range(study.seeds):
        seed = base.seed + i
        runs += _run_seed(base, configs, seed, study, layout)
        atomic_write_json(layout.root / "runs.json", [asdict(r) for r in runs])
    return runs
