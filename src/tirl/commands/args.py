"""What the `tirl` commands that read the config tree share: `--config FILE` plus dotted overrides, and loading
them into a `TirlConfig` (the task and the device checked before anything is written)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from tirl.commands.run_config import TirlConfig
from tirl.core.config import ConfigError, load_config


def load_run_config(args: argparse.Namespace, path: str | Path | None = None) -> TirlConfig:
    """The run config of a command: `path` (default `--config`; the dataclass defaults without one) with the
    dotted overrides; a command that runs a stage also has its task and device checked here, before any output
    directory is claimed."""
    path = path or args.config
    task = getattr(args, "task", None)  # demo's --task, when given
    # `task=NAME` is short for `task.name=NAME` (a registered task or package.module:attribute)
    overrides = [f"task.name={o[5:]}" if o.startswith("task=") else o for o in args.overrides]
    refuse_two_tasks(task, args.overrides)
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


def refuse_two_tasks(task: str | None, overrides: Sequence[str]) -> None:
    """Raise when demo's --task and a `task=`/`task.name=` override name different tasks (the override would win
    silently)."""
    for o in overrides:
        key, _, value = o.partition("=")
        if task is not None and key.strip() in ("task", "task.name") and value.strip() != task:
            raise ConfigError(f"--task {task} and {o} name different tasks: give one of them")


def add_config_command(sub, name: str, help_: str, fn) -> argparse.ArgumentParser:
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


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value
