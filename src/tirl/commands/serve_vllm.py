"""`tirl serve-vllm`: a vLLM server that trainers on other machines sample from and sync weights into.

The server a trainer starts for itself binds 127.0.0.1; a run across machines (`rollout.urls`, `tirl launch`) needs
servers started on their own nodes, each exactly as tirl starts its own: the same command line
(`tirl.rollout.engines.vllm.command.server_command`: processed log-probs, vLLM's generation config, eager on a CPU),
the weight receiver on its `PYTHONPATH` for the in-memory sync, the key middleware, and a tied model served untied.
The key comes from `$TIRL_VLLM_API_KEY` (the trainers' environment holds the same one), never the command line; the
server is `exec`ed, so a scheduler's signals reach vLLM itself.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from tirl.core.errors import TirlError


def add_serve_vllm_parser(sub: Any) -> None:
    p = sub.add_parser(
        "serve-vllm",
        help="a vLLM server for trainers on other machines (rollout.urls), with tirl's weight receiver and key",
        description=__doc__.split("\n\n")[0],
    )
    p.add_argument(
        "model", help="a Hugging Face model directory (or a Hub id in the local cache) every node reads"
    )
    p.add_argument(
        "--host", default="127.0.0.1", help="interface to bind: the node's address (default 127.0.0.1)"
    )
    p.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    p.add_argument(
        "--dtype",
        default="",
        choices=["", "float32", "bfloat16", "float16"],
        help="the served dtype, as the trainers' rollout.dtype (default bfloat16 with a GPU, else float32)",
    )
    p.add_argument("--kv-cache-gib", type=float, default=0.0, help="KV cache size; 0 = vLLM's default")
    p.add_argument(
        "--python", default="", help="the Python with vLLM (default: $TIRL_VLLM_PYTHON, then .venv-vllm)"
    )
    p.add_argument(
        "--work-dir",
        default="",
        help="where an untied copy of a tied model goes (default: a temp dir)",
    )
    p.add_argument(
        "--print", action="store_true", help="print the command line as JSON instead of starting it"
    )
    p.add_argument(
        "--vllm-arg",
        action="append",
        default=[],
        dest="vllm_args",
        metavar="ARG",
        help="one extra vLLM argument, repeatable: --vllm-arg=--max-model-len=4096",
    )
    p.set_defaults(fn=serve_vllm_command)


def serve_vllm_command(args: argparse.Namespace) -> int:
    from tirl.models.hub import resolve_model
    from tirl.rollout.engines.vllm.command import (
        VLLMEngineConfig,
        on_gpu,
        private_ipc_dir,
        resolve_vllm_python,
        server_command,
        server_env,
    )
    from tirl.rollout.engines.vllm.ext.tirl_weight_receiver import KEY_ENV
    from tirl.rollout.engines.vllm.weights import is_plain_hf_dir, ties_embeddings, untied_copy

    if not 0 < args.port < 65536:
        raise TirlError(f"--port must be in 1..65535, got {args.port}")
    if args.kv_cache_gib < 0:
        raise TirlError(f"--kv-cache-gib must be >= 0, got {args.kv_cache_gib:g}")
    key = os.environ.get(KEY_ENV, "")
    if not key:
        raise TirlError(
            f"${KEY_ENV} is empty; set it to the run's key (the trainers' environment holds the same "
            "one): without it anyone who reaches the port could replace the weights"
        )
    extra = list(args.vllm_args)
    model = resolve_model(args.model).path
    if not is_plain_hf_dir(model):
        raise TirlError(
            f"{args.model} is no Hugging Face model directory vLLM can serve (config.json, *.safetensors, tokenizer); "
            "a checkpoint or LoRA adapter needs tirl export first"
        )
    gpu = on_gpu()
    cfg = VLLMEngineConfig(
        model=str(model),
        python=args.python,
        port=args.port,
        kv_cache_gib=args.kv_cache_gib,
        dtype=args.dtype or ("bfloat16" if gpu else "float32"),
        extra_args=extra,
    )
    python = resolve_vllm_python(cfg.python)
    served = model
    if ties_embeddings(model):  # an in-place reload would leave a tied lm_head stale (weights.py)
        if args.print:  # where the copy would go; nothing is written
            served = Path(args.work_dir or tempfile.gettempdir()) / "initial"
        else:
            work = Path(args.work_dir) if args.work_dir else Path(tempfile.mkdtemp(prefix="tirl-serve-vllm-"))
            served = untied_copy(model, work / "initial")
    cmd = server_command(cfg, str(served), python, cfg.port, gpu, host=args.host)
    if args.print:
        print(json.dumps({"argv": cmd, "untied": served != model}))
        return 0
    env = server_env(gpu, key, ipc_dir=private_ipc_dir())
    print(f"tirl serve-vllm: http://{args.host}:{args.port} serving {model}", file=sys.stderr, flush=True)
    os.execve(python, cmd, env)
    return 1  # not reached
