"""`tirl launch slurm|k8s`: argument parsing and the command; the files themselves are `tirl.launch`.

tirl launch slurm --out DIR --run-dir RUN [sizing] [--partition P --account A --time T] [-- OVERRIDES]
tirl launch k8s   --out DIR --run-dir RUN --image IMAGE --pvc CLAIM [sizing] [-- OVERRIDES]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from tirl.launch.layout import LaunchError, Layout, model_from


def add_launch_parser(sub: Any) -> None:
    """Register `tirl launch slurm` and `tirl launch k8s` on the top-level subparsers."""
    p = sub.add_parser(
        "launch", help="write the files that run one tirl run on several nodes (Slurm, Kubernetes)"
    )
    lsub = p.add_subparsers(dest="launch_command", required=True)
    s = lsub.add_parser("slurm", help="tirl.sbatch and tirl-node.sh: one job, one srun step, a role per node")
    _add_layout_options(s, python=sys.executable)
    s.add_argument("--partition", default=None, help="#SBATCH --partition")
    s.add_argument("--account", default=None, help="#SBATCH --account")
    s.add_argument("--time", default=None, help="#SBATCH --time, e.g. 24:00:00")
    s.add_argument(
        "--notice-s",
        type=int,
        default=300,
        help="seconds before the time limit to checkpoint and requeue (300)",
    )
    s.set_defaults(fn=_slurm)
    k = lsub.add_parser("k8s", help="tirl.yaml: Secret, Indexed Job, vLLM StatefulSet, sandbox Deployment")
    _add_layout_options(k, python="python")
    k.add_argument("--image", required=True, help="the container image every pod runs (tirl and vLLM inside)")
    k.add_argument(
        "--pvc", required=True, help="the PersistentVolumeClaim mounted at the run directory's parent"
    )
    k.add_argument("--backoff-limit", type=int, default=3, help="retries of failed trainer pods (default 3)")
    k.set_defaults(fn=_k8s)


def _add_layout_options(p: argparse.ArgumentParser, *, python: str) -> None:
    p.add_argument("--out", required=True, help="the directory to write the files into")
    p.add_argument(
        "--run-dir", required=True, help="the run's output directory (absolute, on shared storage)"
    )
    p.add_argument("--stage", choices=["rl", "sft"], default="rl", help="the tirl stage to run (default rl)")
    p.add_argument("--config", default=None, help="the run's YAML config (tirl STAGE --config)")
    p.add_argument("--train-nodes", type=int, default=1, help="nodes that train (torchrun), default 1")
    p.add_argument("--gpus-per-node", type=int, default=0, help="GPUs per node; 0: CPU only (default)")
    p.add_argument(
        "--vllm-nodes", type=int, default=None, help="nodes of vLLM servers (rl: default 1; sft: none)"
    )
    p.add_argument("--servers-per-node", type=int, default=1, help="vLLM servers per vLLM node (default 1)")
    p.add_argument(
        "--sandbox-node",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the sandbox on a node of its own (rl default); --no-sandbox-node: beside the first vLLM node's servers",
    )
    p.add_argument("--model", default="", help="the model the vLLM servers load (default: model.path)")
    p.add_argument(
        "--python", default=python, help=f"the interpreter every node runs tirl with (default {python})"
    )
    p.add_argument(
        "--rdzv-port", type=int, default=29500, help="torchrun's c10d rendezvous port (default 29500)"
    )
    p.add_argument("--vllm-port", type=int, default=8000, help="the first vLLM server's port (default 8000)")
    p.add_argument("--sandbox-port", type=int, default=8080, help="the sandbox service's port (default 8080)")
    p.add_argument(
        "--vllm-arg",
        action="append",
        default=[],
        help="an argument for every vLLM server (repeat; write --vllm-arg=--max-model-len=4096)",
    )
    p.add_argument(
        "--name", default="tirl", help="the Slurm job's name, the prefix of the Kubernetes objects"
    )
    p.add_argument("overrides", nargs="*", help="dotted overrides for tirl STAGE, after --: rl.steps=100")


def _layout(args: argparse.Namespace, config: str | None) -> Layout:
    overrides = tuple(args.overrides)
    model = args.model
    if args.stage == "rl" and not model:
        text = Path(config).read_text(encoding="utf-8") if config and os.path.isfile(config) else None
        model = model_from(overrides, text)
    return Layout(
        stage=args.stage,
        run_dir=args.run_dir,
        python=args.python,
        train_nodes=args.train_nodes,
        gpus_per_node=args.gpus_per_node,
        vllm_nodes=args.vllm_nodes,
        servers_per_node=args.servers_per_node,
        sandbox_node=args.sandbox_node,
        model=model,
        config=config,
        rdzv_port=args.rdzv_port,
        vllm_port=args.vllm_port,
        sandbox_port=args.sandbox_port,
        overrides=overrides,
        vllm_args=tuple(args.vllm_arg),
        name=args.name,
    )


def _summary(layout: Layout) -> str:
    roles = layout.roles()
    return ", ".join(f"node {i}: {role}" for i, role in enumerate(roles))


def _slurm(args: argparse.Namespace) -> int:
    from tirl.launch.slurm import SlurmOptions, write

    config = None
    if args.config:  # every node starts in its own working directory: name the file absolutely
        config = os.path.abspath(args.config)
        if not os.path.isfile(config):
            raise LaunchError(f"--config {args.config}: no such file")
    layout = _layout(args, config)
    opts = SlurmOptions(
        partition=args.partition, account=args.account, time=args.time, notice_s=args.notice_s
    )
    sbatch, node = write(layout, opts, args.out)
    print(f"wrote {sbatch} and {node} ({layout.nodes} nodes: {_summary(layout)})")
    print(f"submit: sbatch {sbatch}    log: {os.path.join(layout.run_dir, 'slurm-JOBID.out')}")
    return 0


def _k8s(args: argparse.Namespace) -> int:
    from tirl.launch.k8s import K8sOptions, write

    layout = _layout(args, args.config)
    opts = K8sOptions(image=args.image, pvc=args.pvc, backoff_limit=args.backoff_limit)
    path = write(layout, opts, args.out)
    print(f"wrote {path} (0600: it holds the run's keys; {layout.train_nodes} trainer pod(s))")
    print(f"apply: kubectl apply -f {path}    follow: kubectl logs -f job/{layout.name}-train")
    return 0
