"""The `tirl` command: `demo`, `sft`, `rl`, `eval`, each taking an optional YAML config and dotted overrides.

tirl demo [--config FILE] [key=value ...]
tirl sft  --config FILE [model.path=DIR sft.data=FILE ...] [--out DIR]
tirl rl   --config FILE [model.path=DIR rl.data=FILE ...]  [--out DIR]
tirl eval --config FILE [model.path=DIR eval.data=FILE ...] [--out DIR] [--label NAME]
tirl data prepare NAME --out FILE.parquet [--wording recipe|plain] [--source FILE]
tirl data inspect FILE [--model DIR] [--format qwen3]
tirl check-tokens FILE [--model DIR] [--format F] [--config FILE] [--data FILE] [--strict]
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from tirl.config import ConfigError, load_config

DEMO_CONFIG = Path(__file__).parent / "configs" / "demo.yaml"


def _config(args: argparse.Namespace):
    from tirl.run_config import TirlConfig

    path = args.config or (DEMO_CONFIG if args.command == "demo" else None)
    return load_config(TirlConfig, path, args.overrides)


def _cmd_demo(args: argparse.Namespace) -> int:
    from tirl.demo import run_demo

    run_demo(_config(args))
    return 0


def _cmd_stage(args: argparse.Namespace) -> int:
    from tirl.logging import console
    from tirl.stages import run_eval, run_rl, run_sft, setup_torch

    cfg = _config(args)
    setup_torch(cfg)
    out = Path(args.out or Path(cfg.out_dir) / args.command)
    if args.command == "sft":
        console.print(f"checkpoint: {run_sft(cfg, out)}")
    elif args.command == "rl":
        console.print(f"checkpoint: {run_rl(cfg, out)}")
    else:
        summary = run_eval(cfg, out, label=args.label)
        for source, metrics in summary.items():
            shown = "  ".join(f"{k}={v:.3f}" for k, v in metrics.items() if "@" in k)
            console.print(f"{source}: {shown}")
        console.print(f"records: {out / 'records.jsonl'}")
    return 0


def _cmd_data(args: argparse.Namespace) -> int:
    from tirl.data.commands import inspect_command, prepare_command

    if args.data_command == "prepare":
        return prepare_command(args.name, args.out, wording=args.wording, source=args.source)
    return inspect_command(args.file, model=args.model, fmt=args.format)


def _cmd_check_tokens(args: argparse.Namespace) -> int:
    from tirl.tokcheck import check_tokens_command

    return check_tokens_command(
        args.file, model=args.model, fmt=args.format, config=args.config, data=args.data, strict=args.strict
    )


def _add_data_commands(sub: argparse._SubParsersAction) -> None:
    from tirl.chat.template import FORMATS
    from tirl.data.benchmarks import NAMES, WORDINGS

    data = sub.add_parser("data", help="prepare benchmark files; inspect a dataset").add_subparsers(
        dest="data_command", required=True
    )
    p = data.add_parser("prepare", help="write a benchmark as RL-schema rows (.parquet or .jsonl)")
    p.add_argument("name", choices=NAMES)
    p.add_argument("--out", required=True, help="output file (.parquet or .jsonl)")
    p.add_argument(
        "--wording", choices=WORDINGS, default="recipe", help="prompt wording (default: the recipe's)"
    )
    p.add_argument("--source", default=None, help="gpqa: GPQA's CSV; livecodebench: the Open-AgentRL parquet")
    p.set_defaults(fn=_cmd_data)
    p = data.add_parser("inspect", help="schema, rows per data_source, a rendered example, invalid rows")
    p.add_argument("file")
    p.add_argument("--model", default=None, help="tokenizer directory (default: the Qwen vocabulary)")
    p.add_argument("--format", choices=FORMATS, default="qwen3")
    p.set_defaults(fn=_cmd_data)
    p = sub.add_parser("check-tokens", help="re-render rollouts or SFT rows; compare ids and loss masks")
    p.add_argument("file", help="trajectories.jsonl (tirl eval) or an SFT file")
    p.add_argument("--model", default=None, help="tokenizer directory (default: the config's model.path)")
    p.add_argument("--format", choices=FORMATS, default=None, help="chat format (default: the config's)")
    p.add_argument("--config", default=None, help="run config (default: config.yaml next to FILE, if any)")
    p.add_argument("--data", default=None, help="the evaluated rows, for trajectories without meta.prompt")
    p.add_argument("--strict", action="store_true", help="also fail on sampled turns split non-canonically")
    p.set_defaults(fn=_cmd_check_tokens)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tirl", description="Tool-integrated RL: train and evaluate LMs that reason with a Python tool."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    def add(name: str, help_: str, fn) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_)
        p.add_argument(
            "--config",
            default=None,
            help="YAML config (default: the dataclass defaults; for demo, the packaged configs/demo.yaml)",
        )
        p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. rl.steps=10 eval.n=16")
        p.set_defaults(fn=fn)
        return p

    add("demo", "the whole loop on a tiny model: data, SFT, eval, RL, eval, report", _cmd_demo)
    for name, help_ in (
        ("sft", "supervised fine-tuning on multi-turn tool trajectories (sft.data)"),
        ("rl", "GRPO-TCR on prompts (rl.data) from model.path"),
        ("eval", "n samples per problem of eval.data: records, trajectories, pass@k"),
    ):
        p = add(name, help_, _cmd_stage)
        p.add_argument("--out", default=None, help="output directory (default: OUT_DIR/<command>)")
        if name == "eval":
            p.add_argument("--label", default="model", help="model label written into every record")
    _add_data_commands(sub)
    return parser


def _quiet_libraries() -> None:
    """tirl draws its own progress bars; silence transformers' per-file ones."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _quiet_libraries()
    try:
        return args.fn(args)
    except (ConfigError, FileNotFoundError, ValueError) as e:
        if os.environ.get("TIRL_DEBUG"):
            raise
        print(f"tirl {args.command}: error: {e}  (TIRL_DEBUG=1 shows the traceback)", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
