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
tirl config migrate FILE [--out FILE]   (an older config file in the current keys)
tirl sandbox serve [--host H] [--port P] [--workers N] [--config FILE] [sandbox.key=value ...]
tirl serve-policy --config FILE [model.path=DIR ...] [--host H] [--port P] [--out DIR]   (an OpenAI endpoint)
tirl serve-vllm MODEL [--host H] [--port P] [--dtype D] [--vllm-arg=ARG ...]   (for rollout.urls; key in env)
torchrun --nproc_per_node=N -m tirl sft|rl ...   (FSDP2 over N processes: gloo on CPU, nccl on CUDA)
tirl plan --config FILE [--stage rl|sft] [--nproc N] [--gpu-gib G] [--arch NAME|config.json] [--json]
tirl launch slurm|k8s --out DIR --run-dir RUN [--train-nodes T --vllm-nodes M ...] [-- OVERRIDES]
"""

from __future__ import annotations

import argparse
import errno
import os
import re
import sys
from collections.abc import Sequence

from tirl import __version__
from tirl.commands.analyze import add_analyze_parser
from tirl.commands.config import add_config_parser
from tirl.commands.data import add_data_parser
from tirl.commands.launch import add_launch_parser
from tirl.commands.models import add_export_parser, add_model_parser
from tirl.commands.plan import add_plan_parser
from tirl.commands.sandbox import add_sandbox_parser
from tirl.commands.serve_policy import add_serve_policy_parser
from tirl.commands.serve_vllm import add_serve_vllm_parser
from tirl.commands.stage import add_stage_parsers
from tirl.commands.tokcheck import add_check_tokens_parser
from tirl.core.config import ConfigError
from tirl.core.errors import TirlError
from tirl.demo.command import add_compare_parser, add_demo_parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tirl", description="Tool-integrated RL: train and evaluate LMs that reason with a Python tool."
    )
    parser.add_argument("--version", action="version", version=f"tirl {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    add_demo_parser(sub)  # tirl demo (demo/command.py)
    add_compare_parser(sub)  # tirl compare (demo/command.py)
    add_stage_parsers(sub)  # tirl sft | rl | eval (commands/stage.py)
    add_export_parser(sub)  # tirl export (commands/models.py)
    add_plan_parser(sub)  # tirl plan (commands/plan.py)
    add_analyze_parser(sub)  # tirl analyze (commands/analyze.py)
    add_data_parser(sub)  # tirl data prepare|inspect|stitch|sample|filter (commands/data.py)
    add_check_tokens_parser(sub)  # tirl check-tokens (commands/tokcheck.py)
    add_sandbox_parser(sub)  # tirl sandbox serve (commands/sandbox.py)
    add_serve_policy_parser(sub)  # tirl serve-policy (commands/serve_policy.py)
    add_serve_vllm_parser(sub)  # tirl serve-vllm (commands/serve_vllm.py)
    add_model_parser(sub)  # tirl model import (commands/models.py)
    add_config_parser(sub)  # tirl config migrate (commands/config.py)
    add_launch_parser(sub)  # tirl launch slurm|k8s (commands/launch.py)
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
# safetensors' writer, as its error prints the OS error: "... I/O error: No space left on device (os error 28)",
# or, in older releases, "IoError(Os { code: 28, ... })"
_RUST_OS_ERROR = re.compile(r"\(os error (\d+)\)|\bOs \{ code: (\d+)")


def _os_error(e: BaseException, args: argparse.Namespace) -> str | None:
    """One line for a file-system error of OS_ERRORS (naming the file, else the command's output), else None."""
    code = e.errno if isinstance(e, OSError) else None
    if code is None and (m := _RUST_OS_ERROR.search(str(e))):
        code = int(m.group(1) or m.group(2))
    if code not in OS_ERRORS:
        return None
    path = getattr(e, "filename", None) or getattr(args, "out", None)
    where = f"{path}: " if path else ""
    return f"{where}{os.strerror(code)} ({errno.errorcode[code]}): {OS_ERRORS[code]}"


def _actionable(e: BaseException) -> bool:
    """An error whose message says what to do, printed without its traceback: tirl's own, a bad value or missing
    file, and a rollout server that failed or exited (`EngineError`: the message names the server, its exit code and
    log; only the engine module raises it, so it is looked up where that module is loaded, never imported here)."""
    if isinstance(e, ConfigError | FileNotFoundError | ValueError | TirlError):
        return True
    engine = sys.modules.get("tirl.rollout.engines.openai.engine")
    return engine is not None and isinstance(e, engine.EngineError)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _quiet_libraries()
    try:
        return args.fn(args)
    except Exception as e:
        if _actionable(e):
            message = str(e)
        elif (message := _os_error(e, args)) is None:
            raise
        if os.environ.get("TIRL_DEBUG"):
            raise
        print(f"tirl {args.command}: error: {message}  (TIRL_DEBUG=1 shows the traceback)", file=sys.stderr)
        if getattr(e, "exit_now", False):  # threads blocked on a dead peer would hold the exit (RankLost)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(2)
        return 2


if __name__ == "__main__":
    sys.exit(main())
