"""`tirl demo` and `tirl compare`: their parsers and commands (cli.py only registers them). They live with the demo,
which sits above the commands layer, rather than in `tirl.commands`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tirl.commands.args import add_config_command, load_run_config, positive_int
from tirl.core.rundir import claim

CONFIGS = Path(__file__).parent.parent / "configs"  # tirl/configs, spelled as cli.py spelled it
DEMO_CONFIG = CONFIGS / "demo.yaml"
DEMO_MODELS = {"tiny": DEMO_CONFIG, "smollm2": CONFIGS / "demo-smollm2.yaml"}
DEMO_TASKS = {"gsm8k": CONFIGS / "demo-smollm2-gsm8k.yaml"}  # with --model smollm2
STUDY_CONFIG = CONFIGS / "study-smollm2-gsm8k.yaml"  # demo --model smollm2 --study


def _config(args: argparse.Namespace):
    """The demo's run config: --config, else the packaged config of --model, --task and --study."""
    path = args.config
    if not path:
        path = DEMO_TASKS[args.task] if args.task in DEMO_TASKS else DEMO_MODELS[args.model]
        path = STUDY_CONFIG if args.study else path
    return load_run_config(args, path)


def demo_command(args: argparse.Namespace) -> int:
    if args.seeds != 1 and (args.model != "tiny" or args.compare):
        print("tirl demo: --seeds runs the tiny demo only (without --compare)", file=sys.stderr)
        return 2
    if args.task not in (None, "arith") and args.model != "smollm2":
        print(
            f"tirl demo: --task {args.task} runs with --model smollm2 (the tiny model is built for arith)",
            file=sys.stderr,
        )
        return 2
    if args.study and (args.model != "smollm2" or args.task != "gsm8k" or args.compare not in (None, "data")):
        print(
            "tirl demo: --study runs with --model smollm2 --task gsm8k (and takes --compare data only)",
            file=sys.stderr,
        )
        return 2
    if args.compare and not args.study and not _compare_fits(args):
        return 2
    from tirl.train.signals import EXIT_RESUMABLE, StopRequested

    try:
        _run_demo(args)
    except StopRequested as e:  # a checkpoint is written: the same command continues from it
        print(f"tirl demo: {e}", file=sys.stderr)
        return EXIT_RESUMABLE
    return 0


def _run_demo(args: argparse.Namespace) -> None:
    """The demo `args` name (checked by demo_command): the study, the SmolLM2 demo, a comparison or the tiny demo."""
    if args.study:
        from tirl.demo.gsm8k_data_study import run_study_data_comparison
        from tirl.demo.gsm8k_study import run_gsm8k_study

        cfg = _config(args)
        with claim(cfg.out_dir, "demo"):
            (run_study_data_comparison if args.compare else run_gsm8k_study)(cfg)
        return
    if args.model == "smollm2":
        from tirl.demo.compare import run_compare
        from tirl.demo.smollm2 import run_smollm2_demo

        cfg = _config(args)
        with claim(cfg.out_dir, "demo"):
            run_smollm2_demo(cfg)
            for name in _presets_of(args.compare):  # their training stages the demo's own (reused)
                run_compare(cfg, name, temperatures=None)
        return
    if args.compare:
        from tirl.demo.compare import run_compare

        temps = [float(t) for t in args.temperatures.split(",") if t.strip()]
        cfg = _config(args)
        with claim(cfg.out_dir, "demo"):
            run_compare(cfg, args.compare, temperatures=temps)
        return
    from tirl.demo.tiny import run_demo

    cfg = _config(args)
    with claim(cfg.out_dir, "demo"):
        if args.seeds == 1:
            run_demo(cfg)
        else:
            from tirl.demo.seeds import run_seeds

            run_seeds(cfg, args.seeds, run_demo)


def _presets_of(compare: str | None) -> tuple[str, ...]:
    """The presets `--compare` runs after the SmolLM2 demo: data compares the SFT models, then the RL models."""
    return ("data", "data-rl") if compare == "data" else (compare,) if compare else ()


def _compare_fits(args: argparse.Namespace) -> bool:
    """--compare names a comparison of --model's demo (data: on --task gsm8k); else says which it takes."""
    from tirl.demo.ablation.presets import objectives, packaged

    if args.model == "smollm2":
        smollm2 = [name for name, p in packaged().items() if p.study.stages == "smollm2"]
        ok = args.compare in smollm2 and (args.compare != "data" or args.task == "gsm8k")
        takes = "lora, or data with --task gsm8k"
    else:
        ok, takes = args.compare in objectives(), f"a pass@k objective: {', '.join(objectives())}"
    if not ok:
        print(
            f"tirl demo --model {args.model}: --compare {args.compare!r}; it takes {takes}", file=sys.stderr
        )
    return ok


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
        choices=sorted(DEMO_MODELS),
        default="tiny",
        help="tiny: a ~1M-parameter model built from scratch (configs/demo.yaml); smollm2: SmolLM2-135M-Instruct "
        "learns the code tool, SFT then GRPO-TCR with vLLM (configs/demo-smollm2.yaml; --compare lora adds LoRA RL)",
    )
    demo.add_argument(
        "--task",
        choices=["arith", *sorted(DEMO_TASKS)],
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
