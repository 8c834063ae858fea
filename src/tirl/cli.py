"""The `tirl` command. Stages (demo, sft, rl, eval) take an optional YAML config and dotted overrides; the tools
(analyze, data, check-tokens, sandbox) register their own parsers from their packages.

tirl demo [--config FILE] [task=NAME|pkg.module:attr] [key=value ...]
tirl sft  --config FILE [model.path=DIR sft.data=FILE ...] [--out DIR]
tirl rl   --config FILE [model.path=DIR rl.data=FILE ...]  [--out DIR]
tirl eval --config FILE [model.path=DIR eval.data=FILE ...] [--out DIR] [--label NAME]
tirl compare [--preset NAME | --arm NAME:key=value,... | --arms FILE] [--seeds N] [--baseline NAME] [key=value ...]
tirl export CHECKPOINT --out DIR [--base DIR] [--dtype float32|bfloat16]   (a plain HF model; LoRA merged)
tirl analyze RUN_A RUN_B [...] [--labels base,rl] [--out DIR]   (eval dirs or verl validation dumps)
tirl data prepare NAME --out FILE.parquet [--wording recipe|plain] [--source FILE] [--split train] [--force]
tirl data inspect FILE [--model DIR] [--format qwen3]
tirl data sample --config FILE [overrides] [--data FILE] --out FILE.jsonl [--n 8] [--keep 1] [--force]
tirl data filter --config FILE [overrides] [--data FILE] --out FILE.jsonl [--k 8] [--min-rate 0] [--max-rate 1]
tirl data stitch gsm8k --out FILE.jsonl [--max-steps N] [--limit N] [--split train] [--style text] [--force]
tirl check-tokens FILE [--model DIR] [--format F] [--config FILE] [--data FILE] [--strict]
tirl model import FILE.gguf --out DIR [--dtype float32|bfloat16]   (or --smollm2 instead of FILE)
tirl sandbox serve [--host H] [--port P] [--workers N] [--config FILE] [sandbox.key=value ...]
torchrun --nproc_per_node=N -m tirl sft|rl ...   (FSDP2 over N processes: gloo on CPU, nccl on CUDA)
tirl plan --config FILE [--stage rl|sft] [--nproc N] [--gpu-gib G] [--arch NAME|config.json] [--json]
"""

from __future__ import annotations

import argparse
import errno
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from tirl import __version__
from tirl.core.config import ConfigError, load_config
from tirl.core.errors import TirlError
from tirl.core.rundir import claim

DEMO_CONFIG = Path(__file__).parent / "configs" / "demo.yaml"
DEMO_MODELS = {"tiny": DEMO_CONFIG, "smollm2": Path(__file__).parent / "configs" / "demo-smollm2.yaml"}
DEMO_TASKS = {"gsm8k": Path(__file__).parent / "configs" / "demo-smollm2-gsm8k.yaml"}  # with --model smollm2
STUDY_CONFIG = Path(__file__).parent / "configs" / "study-smollm2-gsm8k.yaml"  # demo --model smollm2 --study


def _config(args: argparse.Namespace):
    from tirl.commands.run_config import TirlConfig

    path = args.config
    task = getattr(args, "task", None)  # demo's --task, when given
    if args.command == "demo" and not path:
        path = DEMO_TASKS[task] if task in DEMO_TASKS else DEMO_MODELS[args.model]
        path = STUDY_CONFIG if getattr(args, "study", False) else path
    # `task=NAME` is short for `task.name=NAME` (a registered task or package.module:attribute)
    overrides = [f"task.name={o[5:]}" if o.startswith("task=") else o for o in args.overrides]
    _refuse_two_tasks(task, args.overrides)
    cfg = load_config(TirlConfig, path, overrides)
    if task is not None and cfg.task.name != task:
        raise ConfigError(
            f"--task {task} and task.name: {cfg.task.name} of {path} name different tasks: give one"
        )
    from tirl.train.dist import env_world_size

    if env_world_size() > 1 and args.command not in ("sft", "rl"):
        raise ValueError(f"tirl {args.command} runs in one process; under torchrun, run tirl sft or tirl rl")
    if args.command in ("demo", "sft", "rl", "eval"):
        from tirl.models.loading import check_device
        from tirl.tasks import load_task

        load_task(cfg.task.name)  # a bad task name or path fails before any model is loaded
        check_device(cfg.model.device)  # a device this machine lacks too, before an output dir is claimed
    return cfg


def _refuse_two_tasks(task: str | None, overrides: Sequence[str]) -> None:
    """Raise when demo's --task and a `task=`/`task.name=` override name different tasks (the override would win
    silently)."""
    for o in overrides:
        key, _, value = o.partition("=")
        if task is not None and key.strip() in ("task", "task.name") and value.strip() != task:
            raise ConfigError(f"--task {task} and {o} name different tasks: give one of them")


def _cmd_demo(args: argparse.Namespace) -> int:
    if args.seeds != 1 and (args.model != "tiny" or args.compare):
        print("tirl demo: --seeds runs the tiny demo only (without --compare)", file=sys.stderr)
        return 2
    if args.task not in (None, "arith") and args.model != "smollm2":
        print(
            f"tirl demo: --task {args.task} runs with --model smollm2 (the tiny model is built for arith)",
            file=sys.stderr,
        )
        return 2
    if args.study and (args.model != "smollm2" or args.task != "gsm8k" or args.compare):
        print(
            "tirl demo: --study runs with --model smollm2 --task gsm8k (without --compare)", file=sys.stderr
        )
        return 2
    if args.study:
        from tirl.demo.gsm8k_study import run_gsm8k_study

        cfg = _config(args)
        with claim(cfg.out_dir, "demo"):
            run_gsm8k_study(cfg)
        return 0
    if args.model == "smollm2":
        from tirl.demo.smollm2 import run_smollm2_demo

        cfg = _config(args)
        with claim(cfg.out_dir, "demo"):
            run_smollm2_demo(cfg, args.compare)
        return 0
    if args.compare:
        from tirl.demo.compare import run_compare

        temps = [float(t) for t in args.temperatures.split(",") if t.strip()]
        cfg = _config(args)
        with claim(cfg.out_dir, "demo"):
            run_compare(cfg, args.compare, temperatures=temps)
        return 0
    from tirl.demo.tiny import run_demo
    from tirl.train.signals import StopRequested

    cfg = _config(args)
    try:
        with claim(cfg.out_dir, "demo"):
            if args.seeds == 1:
                run_demo(cfg)
            else:
                from tirl.demo.seeds import run_seeds

                run_seeds(cfg, args.seeds, run_demo)
    except StopRequested as e:
        print(f"tirl demo: {e}", file=sys.stderr)
        return 130
    return 0


def _cmd_compare(args: argparse.Namespace) -> int:
    from tirl.demo.ablation.command import main_compare

    return main_compare(args, DEMO_CONFIG)


def _cmd_stage(args: argparse.Namespace) -> int:
    from tirl.commands.stages import setup_torch

    cfg = _config(args)
    setup_torch(cfg)
    out = Path(args.out or Path(cfg.out_dir) / args.command)
    args.out = str(out)  # what an OSError without a file name is said to be about (`_os_error`)
    with claim(out, args.command):
        return _run_stage(args, cfg, out)


def _run_stage(args: argparse.Namespace, cfg, out: Path) -> int:
    from tirl.commands.stages import run_eval, run_rl, run_sft
    from tirl.core.logging import console
    from tirl.train.signals import EXIT_RESUMABLE, StopRequested

    if args.command in ("sft", "rl"):
        from tirl.train import dist

        run = run_sft if args.command == "sft" else run_rl
        dist.init_distributed(cfg.dist, cfg.model.device)  # under torchrun; nothing in one process
        try:
            done = run(
                cfg, out, resume=args.resume, allow_changes=args.resume_allow_changes, restart=args.restart
            )
            console.print(f"checkpoint: {done}")
        except StopRequested as e:
            console.print(str(e))
            return EXIT_RESUMABLE
        finally:
            dist.shutdown()
    else:
        summary = run_eval(cfg, out, label=args.label)
        for source, metrics in summary.items():
            shown = "  ".join(f"{k}={v:.3f}" for k, v in metrics.items() if "@" in k)
            console.print(f"{source}: {shown}")
        console.print(f"records: {out / 'records.jsonl'}")
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from tirl.models.export import export_checkpoint

    out = export_checkpoint(args.checkpoint, args.out, base=args.base, dtype=args.dtype)
    print(f"exported {args.checkpoint} -> {out}")
    return 0


def _cmd_plan(args: argparse.Namespace) -> int:
    import json

    from tirl.commands.plan import plan, render

    p = plan(_config(args), stage=args.stage, processes=args.nproc, gpu_gib=args.gpu_gib, arch=args.arch)
    print(json.dumps(p.to_dict(), indent=2) if args.json else render(p))
    return 0 if p.fits else 3


def _cmd_analyze(args: argparse.Namespace) -> int:
    from tirl.eval.analyze import main_analyze

    with claim(args.out, "analyze"):
        return main_analyze(args)


def _add_config_command(sub, name: str, help_: str, fn) -> argparse.ArgumentParser:
    """A subcommand that reads the config tree: --config FILE plus dotted overrides."""
    p = sub.add_parser(name, help=help_)
    p.add_argument(
        "--config",
        default=None,
        help="YAML config (default: the dataclass defaults; for demo, the packaged configs/demo.yaml)",
    )
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. rl.steps=10 eval.n=16")
    p.set_defaults(fn=fn)
    return p


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _add_demo(sub) -> None:
    demo = _add_config_command(
        sub, "demo", "the whole loop on a tiny model: data, SFT, eval, RL, eval, report", _cmd_demo
    )
    demo.add_argument(
        "--compare",
        default=None,
        metavar="OBJECTIVE",
        help="also train RL with this pass@k objective (an advantage estimator taking rl.passk_k: passk, pkpo, "
        "or one registered with a k) from the same SFT checkpoint and seed, evaluate SFT, "
        "GRPO-TCR and it at --temperatures, and analyse the three together (reuses checkpoints in OUT_DIR)",
    )
    demo.add_argument("--temperatures", default="0.6,1.0", help="evaluation temperatures of --compare")
    demo.add_argument(
        "--study",
        action="store_true",
        help="with --model smollm2 --task gsm8k: the GSM8K study (configs/study-smollm2-gsm8k.yaml, hours): SFT "
        "on ~2,000 stitched rows in two styles chosen on a validation slice, RL on the problems it solves "
        "sometimes, validation curve, base/SFT/RL at two temperatures, MATH500 transfer (docs/gsm8k.md)",
    )
    demo.add_argument(
        "--seeds",
        type=_positive_int,
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


def _add_compare(sub) -> None:
    from tirl.demo.ablation.command import add_compare_arguments

    compare = sub.add_parser(
        "compare",
        help="an ablation: arms (named override sets) x seeds, each against a baseline arm with paired intervals",
    )
    add_compare_arguments(compare)
    compare.set_defaults(fn=_cmd_compare)


def _add_stages(sub) -> None:
    """tirl sft | rl | eval."""
    for name, help_ in (
        ("sft", "supervised fine-tuning on multi-turn tool trajectories (sft.data)"),
        ("rl", "GRPO-TCR on prompts (rl.data) from model.path"),
        ("eval", "n samples per problem of eval.data: records, trajectories, pass@k"),
    ):
        p = _add_config_command(sub, name, help_, _cmd_stage)
        p.add_argument(
            "--out",
            default=None,
            help="output directory (default: OUT_DIR/<command>): new, empty, or this command's earlier run",
        )
        if name == "eval":
            p.add_argument("--label", default="model", help="model label written into every record")
        if name in ("sft", "rl"):
            p.add_argument(
                "--resume",
                default=None,
                help="continue from a checkpoint: DIR, or 'auto' for the newest complete one in the output "
                "directory (a fresh start when there is none)",
            )
            p.add_argument(
                "--resume-allow-changes",
                action="store_true",
                help="resume although the data or settings the checkpoint recorded (rl.n, prompts per step, ...) "
                "changed: a deliberate change (the differences are printed)",
            )
            p.add_argument(
                "--restart",
                action="store_true",
                help="start over in an output directory that holds an earlier run: delete its checkpoints, "
                "metrics and final model first (without --resume or --restart, such a directory is refused)",
            )


def _add_export(sub) -> None:
    export = sub.add_parser(
        "export",
        help="write a trained model (final model/ or checkpoint-<k>/; a LoRA adapter merged into its base) as a "
        "plain Hugging Face directory for vLLM, tirl eval or the hub",
    )
    export.add_argument("checkpoint", help="a model directory written by tirl sft/rl")
    export.add_argument(
        "--out",
        required=True,
        help="the directory to write: new, empty, or an earlier export holding only the files it wrote (replaced "
        "whole)",
    )
    export.add_argument(
        "--base", default=None, help="LoRA: the base model's directory, if it moved since training"
    )
    export.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    export.set_defaults(fn=_cmd_export)


def _add_plan(sub) -> None:
    plan = _add_config_command(
        sub, "plan", "memory per process and config checks for a run, without loading weights", _cmd_plan
    )
    plan.add_argument("--stage", choices=["rl", "sft"], default="rl")
    plan.add_argument("--nproc", type=int, default=1, help="processes (GPUs) the run will use (torchrun)")
    plan.add_argument(
        "--gpu-gib", type=float, default=80.0, help="memory of one GPU, GiB (exit code 3 if over)"
    )
    plan.add_argument(
        "--arch",
        default="",
        help="a config.json, or a bundled architecture (when model.path is not downloaded)",
    )
    plan.add_argument("--json", action="store_true", help="print the plan as JSON")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tirl", description="Tool-integrated RL: train and evaluate LMs that reason with a Python tool."
    )
    parser.add_argument("--version", action="version", version=f"tirl {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_demo(sub)
    _add_compare(sub)
    _add_stages(sub)
    _add_export(sub)
    _add_plan(sub)
    from tirl.data.commands import add_parsers
    from tirl.eval.analyze import add_analyze_arguments
    from tirl.models.commands import add_model_parser
    from tirl.sandbox.cli import add_sandbox_parser

    add_analyze_arguments(sub.add_parser("analyze", help="pass@k analysis, report and trajectory viewer"))
    sub.choices["analyze"].set_defaults(fn=_cmd_analyze)
    add_parsers(sub)  # tirl data prepare|inspect, tirl check-tokens
    add_sandbox_parser(sub, _config)  # tirl sandbox serve
    add_model_parser(sub)  # tirl model import
    return parser


def _quiet_libraries() -> None:
    """tirl draws its own progress bars; silence transformers' per-file ones."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


# errors of the file system an output goes to, which the user fixes there, not in tirl -> what to do
OS_ERRORS = {
    errno.ENOSPC: "free some space, or write elsewhere",
    errno.EDQUOT: "free some of your quota, or write elsewhere",
    errno.EFBIG: "the file system caps a file's size: write to another one",
    errno.EACCES: "choose a path you may write, or change its permissions",
    errno.EPERM: "choose a path you may write, or change its permissions",
    errno.EROFS: "write to a writable file system",
    errno.ENAMETOOLONG: "choose a shorter name",
}
_RUST_OS_ERROR = re.compile(r"\bOs \{ code: (\d+)")  # safetensors' writer: IoError(Os { code: 28, ... })


def _os_error(e: BaseException, args: argparse.Namespace) -> str | None:
    """One line for a file-system error of OS_ERRORS (naming the file, else the command's output), else None."""
    code = e.errno if isinstance(e, OSError) else None
    if code is None and (m := _RUST_OS_ERROR.search(str(e))):
        code = int(m.group(1))
    if code not in OS_ERRORS:
        return None
    path = getattr(e, "filename", None) or getattr(args, "out", None)
    where = f"{path}: " if path else ""
    return f"{where}{os.strerror(code)} ({errno.errorcode[code]}): {OS_ERRORS[code]}"


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _quiet_libraries()
    try:
        return args.fn(args)
    except Exception as e:
        if isinstance(e, ConfigError | FileNotFoundError | ValueError | TirlError):
            message = str(e)
        elif (message := _os_error(e, args)) is None:
            raise
        if os.environ.get("TIRL_DEBUG"):
            raise
        print(f"tirl {args.command}: error: {message}  (TIRL_DEBUG=1 shows the traceback)", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
