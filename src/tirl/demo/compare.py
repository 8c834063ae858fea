"""`tirl demo --compare OBJECTIVE`: does a pass@k objective keep what GRPO-TCR trades away?

From one SFT checkpoint and one seed, train GRPO-TCR (the demo's RL) and the same run with only the advantage
estimator changed (`passk`: Chen et al.'s analytic pass@k advantage; `pkpo`: PKPO's transformed rewards), evaluate
SFT and both RL models with the same n at several temperatures, and run `tirl analyze` on the three: pass@k curves
with intervals, each RL model's crossover against SFT, solvable sets, and the best temperature per k.

Checkpoints already in OUT_DIR (`sft/model`, `rl/model` from `tirl demo`, `rl-OBJECTIVE/model`) are reused, so a
comparison after a demo trains only the new objective; delete a directory to retrain it.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tirl.algorithms import ADVANTAGE_ESTIMATORS
from tirl.commands.run_config import TirlConfig
from tirl.commands.stages import run_eval, run_rl, setup_torch
from tirl.core.config import save_config
from tirl.core.io import atomic_write_json
from tirl.core.logging import console
from tirl.eval.analyze import print_summary, run_analyze


def objectives() -> list[str]:
    """What `--compare` accepts: the advantage estimators that take pass@k's k (rl.passk_k)."""
    return sorted(name for name, est in ADVANTAGE_ESTIMATORS.items() if "k" in est.hyperparameters)


def _reuse(path: Path, what: str) -> bool:
    if (path / "config.json").exists():
        console.print(f"[bold]{what}[/]: reusing {path} (delete it to retrain)")
        return True
    return False


def run_compare(
    cfg: TirlConfig, objective: str, temperatures: Sequence[float] = (0.6, 1.0)
) -> dict[str, Any]:
    """Train what is missing, evaluate the three models, analyse them together; returns the analysis report."""
    from tirl.demo.tiny import prepare, train_sft_model

    if objective not in objectives():
        raise ValueError(f"unknown comparison objective {objective!r}; valid: {objectives()}")
    setup_torch(cfg)
    out = Path(cfg.out_dir)
    cmp_dir = out / f"compare-{objective}"
    save_config(cfg, cmp_dir / "config.yaml")
    times: dict[str, float] = {}
    prep = prepare(cfg, out)
    sft = out / "sft" / "model"
    if not _reuse(sft, "SFT"):
        sft = train_sft_model(cfg, out, prep, times)
    models = {"sft": sft}
    for label, sub, rl_cfg in (
        ("grpo", "rl", cfg.rl),
        (objective, f"rl-{objective}", dataclasses.replace(cfg.rl, adv_estimator=objective)),
    ):
        path = out / sub / "model"
        if not _reuse(path, f"RL ({label})"):
            t0 = time.time()
            console.print(
                f"[bold]RL[/] {label}: adv_estimator={rl_cfg.adv_estimator}, {rl_cfg.steps} steps, seed {cfg.seed}"
            )
            path = run_rl(
                dataclasses.replace(cfg, rl=rl_cfg),
                out / sub,
                model_path=sft,
                rows=prep["rl_rows"],
                restart=True,
            )
            times[f"rl_{label}"] = time.time() - t0
        models[label] = path
    eval_cfg = dataclasses.replace(cfg, eval=dataclasses.replace(cfg.eval, temperatures=list(temperatures)))
    for label, path in models.items():
        t0 = time.time()
        console.print(f"[bold]eval[/] {label} at temperatures {list(temperatures)}, n={cfg.eval.n}")
        run_eval(eval_cfg, cmp_dir / f"eval-{label}", model_path=path, label=label, rows=prep["test_rows"])
        times[f"eval_{label}"] = time.time() - t0
    t0 = time.time()
    report = run_analyze(
        [cmp_dir / f"eval-{label}" for label in models], cmp_dir / "analysis", labels=list(models)
    )
    times["analyze"] = time.time() - t0
    atomic_write_json(cmp_dir / "seconds.json", times)
    print_summary(report, cmp_dir / "analysis")
    return report
