"""`tirl plan`: its parser, and the table or JSON it prints of a run's memory plan.

What the plan estimates and how (weights, gradients, AdamW state, activations, the rollout engine, the config's
checks) is `tirl.train.plan`; this module only parses the arguments, loads the config and prints.
"""

from __future__ import annotations

import argparse
import json

from tirl.commands.args import add_config_command, load_run_config
from tirl.train.plan import Plan, plan


def render(p: Plan) -> str:
    """A plain-text table for the terminal."""
    rows = [
        ("model", p.arch),
        ("stage / processes", f"{p.stage} / {p.processes}"),
        ("parameters", f"{p.params:,}"),
        ("trainable", f"{p.trainable:,} ({100 * p.trainable / max(p.params, 1):.2f}%)"),
        ("longest sequence", f"{p.sequence_tokens:,} tokens"),
        ("tokens per micro-batch", f"{p.tokens_per_micro_batch:,}  ({p.tokens_source})"),
        ("weights (sharded)", f"{p.weights_gib:8.2f} GiB"),
        ("FSDP gathered units", f"{p.gathered_gib:8.2f} GiB"),
        ("gradients", f"{p.grads_gib:8.2f} GiB"),
        ("AdamW state", f"{p.optimizer_gib:8.2f} GiB"),
        ("KL reference", f"{p.reference_gib:8.2f} GiB"),
        ("activations", f"{p.activations_gib:8.2f} GiB"),
        ("log-prob head", f"{p.logits_gib:8.2f} GiB"),
        ("reserve", f"{p.reserve_gib:8.2f} GiB"),
        (
            "total per process",
            f"{p.total_gib:8.2f} GiB of {p.gpu_gib:g} GiB: {'fits' if p.fits else 'DOES NOT FIT'}",
        ),
    ]
    width = max(len(k) for k, _ in rows)
    lines = [f"{k:<{width}}  {v}" for k, v in rows]
    lines += [f"rollout engine: {p.rollout_engine}"] if p.rollout_engine else []
    lines += [f"note: {n}" for n in p.notes]
    return "\n".join(lines)


def add_plan_parser(sub: argparse._SubParsersAction) -> None:
    plan = add_config_command(
        sub, "plan", "memory per process and config checks for a run, without loading weights", plan_command
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


def plan_command(args: argparse.Namespace) -> int:
    p = plan(
        load_run_config(args), stage=args.stage, processes=args.nproc, gpu_gib=args.gpu_gib, arch=args.arch
    )
    print(json.dumps(p.to_dict(), indent=2) if args.json else render(p))
    return 0 if p.fits else 3
