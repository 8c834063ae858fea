"""`make gpu-check`: the smallest run of each GPU-only path, on one or two CUDA GPUs. Skipped without CUDA.

Each test is a short `tirl rl` run of the vLLM tests' tiny tool-calling Qwen2 at a large learning rate (an update
moves the log-probs by more than 0.1), so `rollout/logprob_diff_max` below the line after every step means the
engine sampled from the updated weights:
1. one process, model on `cuda`, a vLLM server on the same GPU, weights streamed in memory (`rollout.vllm.sync=memory`);
2. torchrun on two GPUs (NCCL, FSDP2) sharing one vLLM server that rank 0 starts;
3. `rollout.vllm.placement=colocated`: vLLM inside the training process, asleep during the update (needs vLLM in the
   trainer's own environment: `pip install vllm` into `.venv`).
GPU float math is not bit-equal to vLLM's (TF32 off, fp32 both sides, different kernels): LOGPROB_ATOL is 1e-2,
ten times below the update's move.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "rollout"))
from bench.common import tirl_env  # noqa: E402
from test_vllm_engine import SKIP, saved_tool_model  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
LOGPROB_ATOL = 1e-2
GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(GPUS == 0, reason="no CUDA GPU: make gpu-check runs on a GPU machine"),
]


@pytest.fixture(scope="module")
def tiny_dir(tokenizer, renderer, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("gpu-tiny")
    saved_tool_model(tokenizer, renderer, path)
    return path


def rl(model: Path, out: Path, *extra: str, nproc: int = 0) -> list[dict]:
    args = [
        "-m", "tirl", "rl", f"model.path={model}", "model.device=cuda", "rollout.engine=vllm", "rollout.dtype=float32",
        "rollout.vllm.args=[--max-model-len=1024,--gpu-memory-utilization=0.25]", "rollout.vllm.kv_cache_gib=0",
        "rl.steps=3", "rl.prompts_per_step=2", "rl.n=4", "rl.mini_batch_size=8", "rl.optim.lr=5e-2",
        "task.num_rl=4", "agent.max_response_tokens=64", "agent.max_tokens_per_turn=32",
        "logging.backends=[jsonl]", *extra, "--out", str(out),
    ]  # fmt: skip
    launcher = [sys.executable]
    if nproc:
        launcher += ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    proc = subprocess.run([*launcher, *args], env=tirl_env(), capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = (out / "metrics.jsonl").read_text().splitlines()
    steps = [m for m in map(json.loads, lines) if "rollout/logprob_diff_max" in m]
    assert len(steps) == 3
    for s in steps:
        assert s["rollout/logprob_diff_max"] < LOGPROB_ATOL, s
    return steps


@pytest.mark.skipif(SKIP is not None, reason=f"vLLM is not installed: {SKIP} (make vllm)")
def test_one_process_with_a_vllm_server_synced_in_memory(tiny_dir, tmp_path):
    rl(tiny_dir, tmp_path / "rl", "rollout.vllm.sync=memory")


@pytest.mark.skipif(GPUS < 2, reason="two GPUs needed for NCCL between training processes")
@pytest.mark.skipif(SKIP is not None, reason=f"vLLM is not installed: {SKIP} (make vllm)")
def test_two_processes_nccl_share_one_server(tiny_dir, tmp_path):
    rl(tiny_dir, tmp_path / "rl", "rollout.vllm.sync=memory", "dist.backend=nccl", nproc=2)


@pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None,
    reason="colocated runs vLLM in the trainer's environment: pip install vllm into it",
)
def test_colocated_engine_sleeps_during_the_update(tiny_dir, tmp_path):
    rl(tiny_dir, tmp_path / "rl", "rollout.vllm.placement=colocated", nproc=1)
