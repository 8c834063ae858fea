"""`tirl demo --compare OBJECTIVE`: does a pass@k objective keep what GRPO-TCR trades away?

The objective preset of `tirl compare` (`tirl.demo.ablation.presets.objective_preset`) on one seed: from one SFT
checkpoint, GRPO-TCR (the demo's RL, arm `grpo`) and the same run with only the advantage estimator changed
(`passk`: Chen et al.'s analytic pass@k advantage; `pkpo`: PKPO's transformed rewards), SFT and both RL models
evaluated with the same n at several temperatures, and `tirl analyze` on the three: pass@k curves with intervals,
each RL model's crossover against SFT, solvable sets, and the best temperature per k.

The training stages live in OUT_DIR as the demo's (`sft/model`, `rl/model`, `rl-OBJECTIVE/model`) and are reused
when made from the same inputs (`tirl.demo.reuse`), so a comparison after a demo trains only the new objective; one
made from other settings or data is retrained, with a line saying which inputs changed. The evaluations, the
analysis and the comparison's report.json go to OUT_DIR/compare-OBJECTIVE/.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tirl.commands.run_config import TirlConfig
from tirl.demo.ablation.arms import with_overrides
from tirl.demo.ablation.presets import objective_preset, objectives
from tirl.demo.ablation.report import run_comparison
from tirl.demo.ablation.runner import Layout

__all__ = ["objectives", "run_compare"]


def run_compare(
    cfg: TirlConfig, objective: str, temperatures: Sequence[float] = (0.6, 1.0)
) -> dict[str, Any]:
    """Train what is missing, evaluate the three models, analyse them together; returns the comparison's report
    (its per-seed analysis in OUT_DIR/compare-OBJECTIVE/analysis/)."""
    preset = objective_preset(objective)
    temps = ",".join(f"{t:g}" for t in temperatures)
    base = with_overrides(cfg, [*preset.base_overrides, f"eval.temperatures=[{temps}]"])
    out = Path(cfg.out_dir)
    layout = Layout(out / f"compare-{objective}", train_root=out, rl_dirs={"grpo": "rl"})
    return run_comparison(base, preset.study, layout)
