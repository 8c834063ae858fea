"""`tirl demo --compare NAME`: a preset of `tirl compare` on one seed, its training stages in the demo's OUT_DIR.

- `passk`, `pkpo` (the tiny demo; `tirl.demo.ablation.presets.objective_preset`): does a pass@k objective keep what
  GRPO-TCR trades away? From one SFT checkpoint, GRPO-TCR (the demo's RL, arm `grpo`, in `rl/`) and the same run
  with only the advantage estimator changed (`passk`: Chen et al.'s analytic pass@k advantage; `pkpo`: PKPO's
  transformed rewards), SFT and both RL models evaluated with the same n at several temperatures.
- `lora` (`--model smollm2`): RL with a LoRA adapter (arm `lora`, in `rl-lora/`) against RL on every weight (arm
  `full`: the demo's `rl/`) from the demo's SFT checkpoint.
- `data` (`--model smollm2 --task gsm8k`): SFT on the trajectories the stitched-SFT model samples and gets right
  (arm `real`, in `sft-real/`, its rows in `data/sft-real.jsonl`) against the stitched SFT (arm `stitched`: the
  demo's `sft/`), both SFT models evaluated the same way.

The training stages live in OUT_DIR as the demo's and are reused when made from the same inputs (`tirl.demo.stages`),
so a comparison after a demo trains only the new arm; one made from other settings or data is retrained, with a
line saying which inputs changed. The evaluations, `tirl analyze` of them (`analysis/`) and the comparison's
report.json (each arm against the baseline with a paired interval over problems) go to OUT_DIR/compare-NAME/.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tirl.commands.run_config import TirlConfig
from tirl.demo.ablation.arms import with_overrides
from tirl.demo.ablation.presets import get_preset, objectives
from tirl.demo.ablation.report import run_comparison
from tirl.demo.ablation.runner import Layout

__all__ = ["objectives", "run_compare"]


def run_compare(
    cfg: TirlConfig, name: str, temperatures: Sequence[float] | None = (0.6, 1.0)
) -> dict[str, Any]:
    """Train what is missing, evaluate the arms (and, for an objective, SFT), analyse them together; returns the
    comparison's report. `temperatures`: the evaluation's (None: the config's)."""
    preset = get_preset(name)
    overrides = list(preset.base_overrides)
    if temperatures is not None:
        overrides.append(f"eval.temperatures=[{','.join(f'{t:g}' for t in temperatures)}]")
    base = with_overrides(cfg, overrides)
    out = Path(cfg.out_dir)
    layout = Layout(out / f"compare-{name}", train_root=out, rl_dirs={preset.study.baseline_arm: "rl"})
    return run_comparison(base, preset.study, layout)
