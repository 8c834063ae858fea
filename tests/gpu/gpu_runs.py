"""What the one-GPU checks (`test_gpu_torch.py`) share: a tiny model directory with its prompt and SFT rows, `tirl`
runs as subprocesses, and readers of the metrics they log. Nothing here needs a GPU: `test_gpu_helpers.py` runs it
on a CPU, so a GPU session finds the readers and the arguments already working."""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
from bench.common import tirl_env
from safetensors.torch import load_file

from conftest import make_model, say_rows
from tirl.tasks.arith.problems import generate_problems

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("nccl_one_rank.py")
STEP_KEYS = ("time", "perf/")  # clocks and memory readings: never compared between runs


def write_tiny(root: Path, tokenizer: Any) -> Path:
    """The tests' tiny Qwen2 (random weights) as a model directory, 8 arithmetic prompts (rl.jsonl) and 40 short
    conversations (sft.jsonl) under `root`."""
    root.mkdir(parents=True, exist_ok=True)
    make_model(tokenizer).save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "model")
    rows = [p.to_row() for p in generate_problems(8, seed=3)]
    (root / "rl.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    sft = say_rows(40)
    (root / "sft.jsonl").write_text("".join(json.dumps(r) + "\n" for r in sft))
    return root


def rl_args(root: Path, out: Path, *extra: str, device: str = "cuda", steps: int = 3) -> list[str]:
    """`tirl rl` on `write_tiny`'s model at a large learning rate (an update moves the log-probs by far more than the
    mismatch lines). Two mini-batches per step and `rl.old_logprobs=recompute`: the trainer recomputes the old
    log-probs before every step's first update, which logs `rollout/logprob_diff_*` against the engine's.
    Overlong shaping makes rewards, and so advantages, differ within a group even when no answer is right."""
    return [
        "rl", f"model.path={root / 'model'}", f"rl.data={root / 'rl.jsonl'}", f"model.device={device}",
        f"rl.steps={steps}", "rl.prompts_per_step=4", "rl.n=4", "rl.mini_batch_size=8", "rl.optim.lr=0.05",
        "rl.old_logprobs=recompute", "reward.overlong=true", "reward.overlong_buffer=16",
        "agent.max_response_tokens=24", "agent.max_tokens_per_turn=24", "threads=1", "logging.backends=[jsonl]",
        *extra, "--out", str(out),
    ]  # fmt: skip


def sft_args(root: Path, out: Path, *extra: str, device: str = "cuda") -> list[str]:
    return [
        "sft", f"model.path={root / 'model'}", f"sft.data={root / 'sft.jsonl'}", f"model.device={device}",
        "sft.epochs=3", "sft.batch_size=8", "sft.optim.lr=0.003", "threads=1", "logging.backends=[jsonl]",
        *extra, "--out", str(out),
    ]  # fmt: skip


def command(args: list[str], *, nproc: int = 0, worker: bool = False) -> list[str]:
    """`python -m tirl ARGS`; with `nproc`, under `torchrun --standalone`; `worker`: `nccl_one_rank.py` in its place
    (the process group made before tirl starts, so that one process still shards)."""
    launcher = [sys.executable]
    if nproc:
        launcher += ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    return [*launcher, *([str(WORKER)] if worker else ["-m", "tirl"]), *args]


def run(cmd: list[str], timeout: float = 600) -> subprocess.CompletedProcess:
    """Runs `cmd` to the end; fails the test with its stderr's tail when it does not exit 0."""
    proc = subprocess.run(cmd, env=tirl_env(), capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-4000:])
    return proc


def kill_after(cmd: list[str], path: Path, timeout: float = 600) -> None:
    """Starts `cmd` and SIGKILLs it as soon as `path` exists (a checkpoint's manifest)."""
    proc = subprocess.Popen(cmd, env=tirl_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.stderr.read().decode()[-4000:]
        assert time.time() < deadline, f"{path} never appeared"
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)


def metric_rows(out: Path) -> list[dict[str, float]]:
    """metrics.jsonl's step rows, without the clocks and memory readings."""
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [{k: v for k, v in r.items() if not k.startswith(STEP_KEYS)} for r in rows if "step" in r]


def per_step(rows: list[dict[str, float]], key: str) -> list[float]:
    """`key` at every step; a step without it fails (a check that reads nothing would pass on nothing)."""
    missing = [r.get("step") for r in rows if key not in r]
    assert rows and not missing, f"{key} missing at steps {missing} of {len(rows)}"
    return [float(r[key]) for r in rows]


def above(values: list[float], line: float) -> list[tuple[int, float]]:
    """(step, value) of every value not below `line` (NaN included)."""
    return [(i, v) for i, v in enumerate(values) if not v < line]


def differences(a: list[dict], b: list[dict], *, rel: float = 0.0, abs_: float = 0.0) -> dict[int, dict]:
    """{step: {key: (a, b)}} of every value that differs beyond `rel`/`abs_` (0, 0: to the bit); {} when none."""
    assert len(a) == len(b), (len(a), len(b))
    out: dict[int, dict] = {}
    for step, (x, y) in enumerate(zip(a, b)):
        diff = {}
        for k in x.keys() | y.keys():
            u, v = x.get(k), y.get(k)
            same = u == v or (
                isinstance(u, float | int)
                and isinstance(v, float | int)
                and math.isclose(u, v, rel_tol=rel, abs_tol=abs_)
            )
            if not same:
                diff[k] = (u, v)
        if diff:
            out[step] = diff
    return out


def weight_gap(a: Path, b: Path) -> tuple[bool, float]:
    """(bit-identical, the largest relative Frobenius distance ||a - b|| / ||a|| over tensors) of two models'
    model.safetensors."""
    wa, wb = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    assert wa.keys() == wb.keys(), sorted(wa.keys() ^ wb.keys())
    exact = all(torch.equal(wa[k], wb[k]) for k in wa)
    gaps = [
        float((wa[k].double() - wb[k].double()).norm() / wa[k].double().norm().clamp(min=1e-30)) for k in wa
    ]
    return exact, max(gaps, default=0.0)


def qwen3_shape(layers: int = 0) -> Any:
    """Qwen3-0.6B's architecture (`tirl plan --arch qwen3-0.6b`: 1024 wide, 28 layers, 16 query and 8 key/value
    heads of 128, MLP 3072, vocabulary 151,936, tied embeddings), with `layers` decoder layers when given."""
    from tirl.train.plan import load_arch

    _, cfg = load_arch("", "qwen3-0.6b")
    if layers:
        cfg.num_hidden_layers = layers
        if getattr(cfg, "layer_types", None):
            cfg.layer_types = cfg.layer_types[:layers]
    return cfg


def fp32_model(cfg: Any, device: str) -> torch.nn.Module:
    """`cfg`'s model (random weights, seed 0) on `device` with fp32 weights, tirl's master weights, whatever the
    config names (Qwen3-0.6B's says bfloat16, which `from_config` would otherwise follow)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    with torch.device(device):
        return AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa", dtype=torch.float32)


def one_update(
    model: torch.nn.Module, *, batch: int, seq: int, autocast: torch.dtype | None, activation_gib: float = 0.0
) -> dict[str, Any]:
    """One RL update of `batch` random sequences of `seq` tokens (the last three quarters trained, one random
    advantage per sequence) through `accumulate_gradients`, with `micro_batch_tokens: auto` resolved for `model` on
    its device (`activation_gib`: model.activation_gib), then the AdamW step. Returns the budget, the micro-batch
    count and, on CUDA, the peak allocated beyond the weights, the batch and the gradients."""
    from tirl.algorithms import get_policy_loss
    from tirl.train.batch import TokenBatch
    from tirl.train.memory import GIB, resolve_micro_batch_tokens
    from tirl.train.optim import OptimConfig, build_optimizer, clip_and_step
    from tirl.train.rl.update import LossSpec, accumulate_gradients

    device = next(model.parameters()).device
    model.train()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, model.config.vocab_size, (batch, seq), generator=g)
    loss_mask = torch.ones_like(ids)
    loss_mask[:, : seq // 4] = 0
    adv = (torch.randn(batch, 1, generator=g).expand(batch, seq) * loss_mask).contiguous()
    mini = TokenBatch(
        ids.to(device), torch.ones_like(ids).to(device), loss_mask.to(device), {"advantages": adv.to(device)}
    )
    budget = resolve_micro_batch_tokens("auto", model, autocast=autocast, activation_gib=activation_gib)
    spec = LossSpec(
        get_policy_loss("ppo"), hyper={"clip_low": 0.2, "clip_high": 0.28, "clip_c": 10.0}, agg="token-mean", norm_len=seq,
        temperature=1.0, micro_batch_tokens=budget.tokens, autocast=autocast,
    )  # fmt: skip
    cfg = OptimConfig(lr=1e-6)
    opt, sched = build_optimizer(model, cfg, 2)
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    state = torch.cuda.memory_allocated() if cuda else 0
    stats = accumulate_gradients(model, mini, None, None, spec)
    peak = torch.cuda.max_memory_allocated() if cuda else 0
    grads = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    _, stepped = clip_and_step(model, opt, sched, cfg, loss=stats["loss/total"])
    return {
        "tokens_per_micro_batch": budget.tokens,
        "budget_gib": budget.budget_gib,
        "micro_batches": int(stats["loss/micro_batches"]),
        "loss_finite": math.isfinite(stats["loss/total"]),
        "stepped": stepped,
        "peak_beyond_state_gib": (peak - state - grads) / GIB if cuda else None,
    }
