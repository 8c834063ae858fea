"""`tirl plan`: its parser, and the table or JSON it prints of a run's memory plan and, with `--gpus`, of its
cluster plan (the GPU split, the weight sync, the step time and the assumptions they rest on).

What the plan estimates and how (weights, gradients, AdamW state, activations, the rollout engine, the config's
checks) is `tirl.train.plan`; the split is `tirl.train.plan_cluster` and the cost of a step
`tirl.train.plan_step`; this module only parses the arguments, loads the config and prints.
"""

from __future__ import annotations

import argparse
import json
import math

from tirl.commands.args import add_config_command, load_run_config, positive_int
from tirl.train.plan import Plan, PlanError, plan
from tirl.train.plan_cluster import ClusterPlan, cluster_plan, spans
from tirl.train.plan_step import GPU_PEAK_FLOPS

# the assumptions of the step time (tirl.train.plan_step.Assumptions), each a flag: (name, unit)
ASSUMPTION_FLAGS = (
    ("decode_tps", "one server's decode tokens/s with enough sequences in flight"),
    ("seq_tps", "one sequence's decode tokens/s"),
    ("prompt_tokens", "mean prompt tokens of a trajectory"),
    ("response_tokens", "mean response tokens of a trajectory (all turns, tool output included)"),
    ("longest_tokens", "response tokens of the longest trajectory of a step"),
    ("turns", "tool calls of a trajectory"),
    ("tool_s", "seconds one tool call takes"),
    ("mfu", "the trainer's share of the GPU's peak"),
    ("peak_flops", "one GPU's dense bf16 FLOP/s (default from --gpu)"),
    ("link_gbps", "one node's link, Gb/s, for the step time"),
    ("loopback_gbps", "a node's training ranks to the receivers on that node, together, Gb/s"),
)
CLUSTER_ONLY = ("gpus_per_node", "rollout_gpus", "vllm_tp", "gpu", *(name for name, _ in ASSUMPTION_FLAGS))


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


PHASES = (
    ("rollout", "rollout"),
    ("old_logprobs", "old log-probs"),
    ("reference", "KL reference"),
    ("update", "update"),
    ("sync", "weight sync"),
)


def _split_lines(c: ClusterPlan) -> list[str]:
    s = c.split
    nodes = math.ceil(c.gpus / c.gpus_per_node)
    head = f"cluster: {c.gpus} GPUs ({nodes} node(s) of {c.gpus_per_node}), --gpu {c.gpu}, placement {c.placement}"
    if c.placement == "colocated":
        split = f"split: all {c.gpus} GPUs train, each with its own vLLM engine ({c.chosen_by})"
    else:
        split = (
            f"split: {s.trainer_gpus} training GPUs + {s.rollout_gpus} rollout GPUs = {s.servers} vLLM server(s) of "
            f"tp {s.tp} (chosen by: {c.chosen_by})"
        )
    lines = [head, split]
    lines.append(
        f"  training rank {s.trainer_gib:.2f} GiB, server GPU {s.server_gib:.2f} GiB: "
        f"{'fits' if s.fits else 'DOES NOT FIT'}"
    )
    for r in c.runners_up:
        lines.append(
            f"  runner-up: {r['trainer_gpus']:g} training + {r['rollout_gpus']:g} rollout GPUs: step "
            f"{r['total_s']:.1f} s, overlapped {r['overlapped_s']:.1f} s"
        )
    lines += [f"  left out: {why} (training GPUs: {spans(ts)})" for why, ts in c.refused.items()]
    return lines


def _sync_lines(c: ClusterPlan) -> list[str]:
    y = c.sync
    lines = [
        "weight sync per step (as rollout.vllm.sync=memory streams it):",
        f"  one copy: {y.elements:,} values in {y.dtype} ({'the served dtype' if y.receivers else 'model.dtype'}) = "
        f"{y.copy_bytes / 1e9:.2f} GB"
        + (", the tied embedding twice (served untied)" if y.untied_embedding else ""),
    ]
    if y.receivers:
        lines.append(
            f"  each trainer machine streams its share of the servers: {y.receivers} vLLM worker(s) from "
            f"{y.sending_nodes} trainer node(s), {y.local_receivers} on their sender's node: "
            f"{y.bytes_per_step / 1e9:.2f} GB a step in all; the busiest sends {y.busiest_link_bytes / 1e9:.2f} GB "
            "over its link"
        )
    else:
        lines.append("  colocated: no socket; each rank loads the gathered tensors into its own engine")
    lines.append(
        f"  FSDP all-gather (model.dtype) over each training node's link: {y.gather_link_bytes / 1e9:.2f} GB"
    )
    table = "   ".join(f"{g} Gb/s: {sec:.1f} s" for g, sec in y.seconds.items())
    lines.append(f"  time: {table}")
    if y.receivers:
        lines.append(
            f"  (the nodes send at once: the slowest node's time; receivers on their sender's node at --loopback-gbps "
            f"{c.assumptions.loopback_gbps:g}; the servers' load time comes on top: bench/results/vllm_sync.json "
            "measures stream and load together)"
        )
    else:
        lines.append(
            "  (the engines' in-place load and each tensor's trip through host memory are not counted)"
        )
    return lines


def _trainer_why(d: dict[str, float], phase: str) -> str:
    """The larger of a trainer phase's compute and FSDP link time, named."""
    compute, link = d[f"{phase}_compute_s"], d[f"{phase}_link_s"]
    bound = "link-bound" if link > compute else "compute-bound"
    return (
        f"{bound}: {d[f'{phase}_flops']:.3g} FLOP in {compute:.1f} s, "
        f"{d[f'{phase}_link_bytes'] / 1e9:.1f} GB over the link in {link:.1f} s"
    )


def _step_lines(c: ClusterPlan) -> list[str]:
    t, a, d = c.step, c.assumptions, c.step.detail
    why = {
        "rollout": f"{t.rollout_bound} bound: throughput {d['rollout_throughput_s']:.1f} s "
        f"({d['server_tokens_per_s']:,.0f} tokens/s a server, {d['in_flight_per_server']:.0f} in flight), longest "
        f"{d['rollout_longest_s']:.1f} s; + tools {d['tools_s']:.1f} s",
        "old_logprobs": _trainer_why(d, "forward") if t.old_logprobs_s else "none: the update's own pass gives them",
        "reference": _trainer_why(d, "forward") if t.reference_s else "none: rl.kl.coef=0",
        "update": _trainer_why(d, "update"),
        "sync": f"at {a.link_gbps:g} Gb/s",
    }  # fmt: skip
    lines = [f"step time (synchronous loop, {d['trained_tokens']:,.0f} trained tokens):"]
    for key, label in PHASES:
        seconds = getattr(t, f"{key}_s")
        lines.append(f"  {label:<14} {seconds:8.1f} s {100 * t.shares[key]:5.1f}%  {why[key]}")
    lines.append(f"  {'total':<14} {t.total_s:8.1f} s")
    lines.append(
        f"  overlapped (rl.off_policy_steps=1 or streaming): max(rollout, trainer phases) + sync = "
        f"{t.overlapped_s:.1f} s"
    )
    return lines


def _figure(value: float) -> str:
    """2560.0 -> "2,560"; 0.35 -> "0.35"; 9.89e14 -> "9.89e+14"."""
    if value == int(value) and abs(value) < 1e9:
        return f"{int(value):,}"
    return f"{value:.4g}"


def render_cluster(c: ClusterPlan) -> str:
    """The cluster plan as text: split, weight sync, step time, assumptions (each with its source)."""
    a = c.assumptions
    lines = [*_split_lines(c), *_sync_lines(c), *_step_lines(c), "assumptions (estimates, not measurements):"]
    for name, _ in ASSUMPTION_FLAGS:
        lines.append(f"  --{name.replace('_', '-'):<16} {_figure(getattr(a, name)):<10} {a.sources[name]}")
    return "\n".join(lines)


def add_plan_parser(sub: argparse._SubParsersAction) -> None:
    plan = add_config_command(
        sub, "plan", "memory per process and config checks for a run, without loading weights", plan_command
    )
    plan.add_argument("--stage", choices=["rl", "sft"], default="rl")
    plan.add_argument(
        "--nproc", type=int, default=None, help="processes (GPUs) the run will use (torchrun); default 1"
    )
    plan.add_argument(
        "--gpu-gib", type=float, default=80.0, help="memory of one GPU, GiB (exit code 3 if over)"
    )
    plan.add_argument(
        "--arch",
        default="",
        help="a config.json, or a bundled architecture (when model.path is not downloaded)",
    )
    plan.add_argument("--json", action="store_true", help="print the plan as JSON")

    cluster = plan.add_argument_group(
        "cluster (rl with rollout.engine=vllm): the GPU split, the weight sync and the step time, estimated from "
        "named assumptions"
    )
    cluster.add_argument("--gpus", type=positive_int, default=None, help="GPUs of the whole run")
    cluster.add_argument("--gpus-per-node", type=positive_int, default=None, help="GPUs a node (default 8)")
    cluster.add_argument(
        "--rollout-gpus", type=positive_int, default=None,
        help="GPUs that run vLLM servers (placement separate; the rest train); default: the shortest step",
    )  # fmt: skip
    cluster.add_argument(
        "--vllm-tp",
        type=positive_int,
        default=None,
        help="a server's tensor parallel size; default: smallest that fits",
    )
    cluster.add_argument(
        "--gpu", choices=sorted(GPU_PEAK_FLOPS), default=None, help="peak FLOP/s preset (h100)"
    )
    for name, help_ in ASSUMPTION_FLAGS:
        cluster.add_argument(f"--{name.replace('_', '-')}", type=float, default=None, help=help_)


def plan_command(args: argparse.Namespace) -> int:
    cfg = load_run_config(args)
    if args.gpus is None:
        if given := [f"--{k.replace('_', '-')}" for k in CLUSTER_ONLY if getattr(args, k) is not None]:
            raise PlanError(f"{', '.join(given)} size(s) a run over a cluster: give --gpus N too")
        p = plan(cfg, stage=args.stage, processes=args.nproc or 1, gpu_gib=args.gpu_gib, arch=args.arch)
        print(json.dumps(p.to_dict(), indent=2) if args.json else render(p))
        return 0 if p.fits else 3
    if args.stage != "rl":
        raise PlanError("--gpus sizes an RL run (--stage rl): its rollout servers, weight sync and step time")
    if args.nproc is not None:
        raise PlanError("--nproc with --gpus: the split decides the training processes; give one of the two")
    p, c = cluster_plan(
        cfg, gpus=args.gpus, gpus_per_node=args.gpus_per_node or 8, rollout_gpus=args.rollout_gpus,
        tp=args.vllm_tp, gpu_gib=args.gpu_gib, arch=args.arch, gpu=args.gpu or "h100",
        given={name: getattr(args, name) for name, _ in ASSUMPTION_FLAGS},
    )  # fmt: skip
    print(
        json.dumps(p.to_dict() | {"cluster": c.to_dict()}, indent=2)
        if args.json
        else render(p) + "\n" + render_cluster(c)
    )
    return 0 if c.split.fits else 3
