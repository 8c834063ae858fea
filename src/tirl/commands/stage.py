"""`tirl sft`, `tirl rl` and `tirl eval`: their parsers and the command (load the config, claim the output
directory, run the stage, print where its result is); the stages themselves are `tirl.commands.stages`."""

from __future__ import annotations

import argparse
from pathlib import Path

from tirl.commands.args import add_config_command, load_run_config
from tirl.commands.run_config import TirlConfig
from tirl.core.errors import TirlError
from tirl.core.rundir import claim


class RankLost(TirlError):
    """Another rank of the run died (its process or its machine): this one stops too, its checkpoints intact.

    `exit_now`: the CLI exits without waiting for this process's other threads, which may be blocked on the dead
    peer or on servers stopping with it (every file is complete already: atomic writes, flushed logs)."""

    exit_now = True


def stage_command(args: argparse.Namespace) -> int:
    from tirl.commands.stages import setup_torch

    cfg = load_run_config(args)
    setup_torch(cfg)
    out = Path(args.out or Path(cfg.out_dir) / args.command)
    args.out = str(out)  # what an OSError without a file name is said to be about (`_os_error`)
    with claim(out, args.command):
        return run_stage_command(args, cfg, out)


def run_stage_command(args: argparse.Namespace, cfg: TirlConfig, out: Path) -> int:
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
        except Exception as e:
            if (why := dist.lost_peer(e)) is None:
                raise
            raise RankLost(
                f"rank {dist.rank()} of {dist.world_size()}: a collective failed because another rank is gone "
                f"({why}); every complete checkpoint in {out} stays: start the run again with --resume auto once "
                "the nodes are back, on any number of processes"
            ) from e
        finally:
            dist.shutdown()
    else:
        summary = run_eval(cfg, out, label=args.label)
        for source, metrics in summary.items():
            shown = "  ".join(f"{k}={v:.3f}" for k, v in metrics.items() if "@" in k)
            console.print(f"{source}: {shown}")
        console.print(f"records: {out / 'records.jsonl'}")
    return 0


def add_stage_parsers(sub: argparse._SubParsersAction) -> None:
    """tirl sft | rl | eval."""
    for name, help_ in (
        ("sft", "supervised fine-tuning on multi-turn tool trajectories (sft.data)"),
        ("rl", "GRPO-TCR on prompts (rl.data) from model.path"),
        ("eval", "n samples per problem of eval.data: records, trajectories, pass@k"),
    ):
        p = add_config_command(sub, name, help_, stage_command)
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
