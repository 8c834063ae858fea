"""`tirl demo` and `tirl compare`: their parsers and commands (cli.py only registers them). They live with the demo,
which sits above the commands layer, rather than in `tirl.commands`.

Each packaged demo is one `Recipe` of `RECIPES`: the flags that choose it (`--model`, `--task`, `--study`), its
config, which `--compare` names and whether `--seeds` it takes, and its runner. `demo_command` looks the flags up
there and checks the rest against the recipe, so a new demo is one entry, not another branch."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tirl.commands.args import add_config_command, load_run_config, positive_int
from tirl.core.rundir import claim

CONFIGS = Path(__file__).parent.parent / "configs"  # tirl/configs, spelled as cli.py spelled it
DEMO_CONFIG = CONFIGS / "demo.yaml"
STUDY_CONFIG = CONFIGS / "study-smollm2-gsm8k.yaml"  # demo --model smollm2 --task gsm8k --study


def _run_tiny(cfg: Any, args: argparse.Namespace) -> None:
    """The tiny demo, over --seeds seeds, or the --compare objective against GRPO-TCR on its stages."""
    if args.compare:
        from tirl.demo.compare import run_compare

        temps = [float(t) for t in args.temperatures.split(",") if t.strip()]
        run_compare(cfg, args.compare, temperatures=temps)
        return
    from tirl.demo.tiny import run_demo

    if args.seeds == 1:
        run_demo(cfg)
        return
    from tirl.demo.seeds import run_seeds

    run_seeds(cfg, args.seeds, run_demo)


def _run_smollm2(cfg: Any, args: argparse.Namespace) -> None:
    """The SmolLM2 demo, then the presets --compare names on its stages (reused): data is the SFT models, then RL."""
    from tirl.demo.compare import run_compare
    from tirl.demo.smollm2 import run_smollm2_demo

    run_smollm2_demo(cfg)
    presets = ("data", "data-rl") if args.compare == "data" else (args.compare,) if args.compare else ()
    for name in presets:
        run_compare(cfg, name, temperatures=None)


def _run_study(cfg: Any, args: argparse.Namespace) -> None:
    """The GSM8K study, or with --compare data its data comparison (on a study that has chosen its SFT)."""
    from tirl.demo.gsm8k_data_study import run_study_data_comparison
    from tirl.demo.gsm8k_study import run_gsm8k_study

    (run_study_data_comparison if args.compare else run_gsm8k_study)(cfg)


def _objectives() -> tuple[str, ...]:
    from tirl.demo.ablation.presets import objectives

    return tuple(objectives())


@dataclass(frozen=True)
class Recipe:
    """One packaged demo: the `--model`/`--task`/`--study` that choose it, its config, the `--compare` names it takes
    (a function: the objectives are whatever advantage estimators are registered), whether it takes `--seeds`, and
    its runner."""

    model: str
    task: str
    study: bool
    config: Path
    run: Callable[[Any, argparse.Namespace], None]
    compares: Callable[[], tuple[str, ...]]
    seeds: bool = False

    @property
    def flags(self) -> str:
        return f"--model {self.model} --task {self.task}" + (" --study" if self.study else "")


RECIPES = (
    Recipe("tiny", "arith", False, DEMO_CONFIG, _run_tiny, _objectives, seeds=True),
    Recipe("smollm2", "arith", False, CONFIGS / "demo-smollm2.yaml", _run_smollm2, lambda: ("lora",)),
    Recipe(
        "smollm2",
        "gsm8k",
        False,
        CONFIGS / "demo-smollm2-gsm8k.yaml",
        _run_smollm2,
        lambda: ("lora", "data", "data-rl"),
    ),
    Recipe("smollm2", "gsm8k", True, STUDY_CONFIG, _run_study, lambda: ("data",)),
)


def config_of(model: str, task: str = "arith", study: bool = False) -> Path:
    """The packaged config of the demo these flags choose."""
    (recipe,) = [r for r in RECIPES if (r.model, r.task, r.study) == (model, task, study)]
    return recipe.config


def recipe_of(args: argparse.Namespace) -> Recipe | str:
    """The recipe the flags choose, checked against --compare and --seeds; else the reason, for the user."""
    task = args.task or "arith"
    found = [r for r in RECIPES if (r.model, r.task, r.study) == (args.model, task, args.study)]
    if not found:
        demos = "; ".join(r.flags for r in RECIPES)
        return f"no demo runs --model {args.model} --task {task}{' --study' if args.study else ''}; the demos: {demos}"
    recipe = found[0]
    if args.compare and args.compare not in recipe.compares():
        return f"{recipe.flags} takes --compare {' or '.join(recipe.compares())} only, not {args.compare!r}"
    if args.seeds != 1 and (not recipe.seeds or args.compare):
        return "--seeds runs the tiny demo only (without --compare)"
    return recipe


def demo_command(args: argparse.Namespace) -> int:
    recipe = recipe_of(args)
    if isinstance(recipe, str):
        print(f"tirl demo: {recipe}", file=sys.stderr)
        return 2
    from tirl.train.signals import EXIT_RESUMABLE, StopRequested

    cfg = load_run_config(args, args.config or recipe.config)
    try:
        with claim(cfg.out_dir, "demo"):
            recipe.run(cfg, args)
    except StopRequested as e:  # a checkpoint is written: the same command continues from it
        print(f"tirl demo: {e}", file=sys.stderr)
        return EXIT_RESUMABLE
    return 0


def compare_command(args: argparse.Namespace) -> int:
    from tirl.demo.ablation.command import main_compare

    return main_compare(args, DEMO_CONFIG)


def add_demo_parser(sub: argparse._SubParsersAction) -> None:
    demo = add_config_command(
        sub, "demo", "the whole loop on a tiny model: data, SFT, eval, RL, eval, report", demo_command
    )
    demo.add_argument(
        "--compare",
        default=None,
        metavar="NAME",
        help="then run the preset of tirl compare NAME on the demo's stages, into OUT_DIR/compare-NAME (reuses "
        "checkpoints in OUT_DIR): the tiny demo takes a pass@k objective (an advantage estimator taking "
        "rl.advantage.k: passk, pkpo, or one registered with a k: RL with it against GRPO-TCR from the same SFT, "
        "SFT evaluated beside them at --temperatures); --model smollm2 takes lora (LoRA RL against full RL) and, "
        "with --task gsm8k, data (SFT on sampled real trajectories against stitched ones)",
    )
    demo.add_argument("--temperatures", default="0.6,1.0", help="evaluation temperatures of --compare")
    demo.add_argument(
        "--study",
        action="store_true",
        help="with --model smollm2 --task gsm8k: the GSM8K study (configs/study-smollm2-gsm8k.yaml, hours): SFT "
        "on ~2,000 stitched rows in two styles chosen on a validation slice, RL on the problems it solves "
        "sometimes, validation curve, base/SFT/RL at two temperatures, MATH500 transfer (docs/gsm8k.md); with "
        "--compare data, on a study that has chosen its SFT: SFT then RL on 400 rows the study's SFT model sampled "
        "against 400 stitched rows of the same problems, into OUT_DIR/compare-data",
    )
    demo.add_argument(
        "--seeds",
        type=positive_int,
        default=1,
        help="run the demo for N seeds (seed, seed+1, ...) into OUT_DIR/seed-<s>/ and report each metric's mean and "
        "range, the pass@1 lift's interval over seeds and problems, and whether the crossover repeats "
        "(OUT_DIR/seeds.json)",
    )
    demo.add_argument(
        "--model",
        choices=sorted({r.model for r in RECIPES}),
        default="tiny",
        help="tiny: a ~1M-parameter model built from scratch (configs/demo.yaml); smollm2: SmolLM2-135M-Instruct "
        "learns the code tool, SFT then GRPO-TCR with vLLM (configs/demo-smollm2.yaml; --compare lora adds LoRA RL)",
    )
    demo.add_argument(
        "--task",
        choices=sorted({r.task for r in RECIPES}),
        default=None,
        help="arith: the generated arithmetic (default); gsm8k (with --model smollm2): GSM8K, SFT on stitched trajectories "
        "from the human solutions, GRPO-TCR, 200 held-out test problems x 16 samples "
        "(configs/demo-smollm2-gsm8k.yaml; --compare data adds SFT on the model's own sampled trajectories)",
    )


def add_compare_parser(sub: argparse._SubParsersAction) -> None:
    from tirl.demo.ablation.command import add_compare_arguments

    compare = sub.add_parser(
        "compare",
        help="an ablation: arms (named override sets) x seeds, each against a baseline arm with paired intervals",
    )
    add_compare_arguments(compare)
    compare.set_defaults(fn=compare_command)
