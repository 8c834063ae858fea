"""RL update throughput and peak memory by training option, each against the single-process full fp32 update.

One RL mini-batch (synthetic ids, a response mask and advantages, as a rollout would hand the trainer) goes through
the real update path (`tirl.train.rl.update.accumulate_gradients` with micro-batches, then the AdamW step) for:
full fp32, bf16 autocast, gradient checkpointing, both, LoRA (rank 16, all linear layers), and full / LoRA on 2
processes (`torchrun`, FSDP2 over gloo, each process taking half the batch). Every variant runs in a fresh
subprocess so that its peak resident memory is its own; on 2 processes the peak is the larger rank's.

Models: the demo's tiny Qwen2 (built here) and a local Hugging Face model: `--model DIR`, `TIRL_BENCH_MODEL`, or
by default the SmolLM2-135M that bench/engines.py imports into runs/smollm2-135m (`make bench` runs it first). Writes
bench/results/train.json.
On a CPU, bf16 autocast is not a speed option (without AVX-512 BF16 or AMX, bf16 matmuls are emulated); the numbers
say what it costs, and a variant slower than `--variant-timeout` is recorded as such rather than holding the run.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import ROOT, SMOLLM2_DIR, result_path, save_tiny, write_result

FP32 = "model.autocast=none"  # the default (auto) would pick bf16 where it pays
VARIANTS: list[tuple[str, int, list[str]]] = [
    ("full fp32", 1, [FP32]),  # the baseline every other row is compared with
    ("bf16 autocast", 1, ["model.autocast=bfloat16"]),
    ("checkpointing", 1, [FP32, "model.gradient_checkpointing=true"]),
    ("bf16 autocast + checkpointing", 1, ["model.autocast=bfloat16", "model.gradient_checkpointing=true"]),
    ("LoRA r16", 1, [FP32, "model.lora.rank=16"]),
    ("full fp32, 2 processes", 2, [FP32]),
    ("LoRA r16, 2 processes", 2, [FP32, "model.lora.rank=16"]),
]


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def synthetic_batch(vocab: int, B: int, T: int, rank: int, world: int) -> tuple[Any, int]:
    """(this rank's share of B random rows of up to T tokens, the first quarter prompt, one advantage per row;
    the tokens of all B rows)."""
    import torch

    from tirl.train.batch import TokenBatch

    g = torch.Generator().manual_seed(1)
    P = T // 4
    lengths = torch.randint(T // 2, T + 1, (B,), generator=g)
    ids = torch.randint(0, vocab, (B, T), generator=g)
    attn = (torch.arange(T)[None, :] < lengths[:, None]).long()
    loss_mask = attn.clone()
    loss_mask[:, :P] = 0
    adv = torch.randn(B, 1, generator=g).expand(B, T) * loss_mask
    rows = list(range(rank, B, world))  # this rank's share
    batch = TokenBatch(ids[rows], attn[rows], loss_mask[rows], {"advantages": adv[rows].contiguous()})
    return batch, int(attn.sum())


def seconds_per_step(one_step: Any, steps: int) -> float:
    """Seconds per call of `one_step` over `steps` calls after one warm-up call (allocator, AdamW state), every
    process timing between the same barriers."""
    from tirl.train import dist

    one_step()
    dist.barrier()
    t = time.perf_counter()
    for _ in range(steps):
        one_step()
    dist.barrier()
    return (time.perf_counter() - t) / steps


def worker(args: argparse.Namespace) -> None:
    """One variant: load, warm up, time `steps` updates; rank 0 writes the result JSON."""
    import torch

    from tirl.algorithms import get_policy_loss
    from tirl.commands.run_config import TirlConfig
    from tirl.core.config import load_config
    from tirl.models.loading import load_policy
    from tirl.train import dist, fsdp
    from tirl.train.optim import OptimConfig, build_optimizer, clip_and_step
    from tirl.train.rl.update import LossSpec, accumulate_gradients

    cfg = load_config(TirlConfig, None, [f"model.path={args.model}", *args.overrides])
    distributed = dist.init_distributed(cfg.dist, cfg.model.device)
    world, rank = dist.world_size(), dist.rank()
    torch.set_num_threads(max(1, args.threads // world))
    torch.manual_seed(0)
    rss_start = _rss_mb()
    policy = load_policy(cfg.model)
    if distributed:
        fsdp.shard_model(policy, reshard_after_forward=cfg.dist.reshard_after_forward)
    policy.train()
    T = args.seq
    batch, tokens = synthetic_batch(policy.config.vocab_size, args.batch, T, rank, world)
    spec = LossSpec(
        get_policy_loss("ppo"),
        hyper={"clip_low": 0.2, "clip_high": 0.28, "clip_c": 10.0},
        agg="token-mean",
        norm_len=T,
        temperature=1.0,
        micro_batch_size=args.micro,
        autocast=cfg.model.autocast_dtype(policy.config.hidden_size),
    )
    opt, sched = build_optimizer(policy, OptimConfig(lr=1e-6), args.steps + 1)
    trainable = sum(p.numel() for p in policy.parameters() if p.requires_grad)
    rss_loaded = _rss_mb()

    def one_step() -> None:
        stats = accumulate_gradients(policy, batch, None, None, spec)
        clip_and_step(policy, opt, sched, OptimConfig(lr=1e-6), loss=stats["loss/total"])

    seconds = seconds_per_step(one_step, args.steps)
    peak = torch.tensor([_rss_mb(), _rss_mb() - rss_loaded], dtype=torch.float64)
    if distributed:
        import torch.distributed as tdist

        tdist.all_reduce(peak, op=tdist.ReduceOp.MAX)
    if rank == 0:
        out = {
            "seconds_per_update": seconds,
            "tokens_per_s": tokens / seconds,
            "peak_rss_mb": float(peak[0]),
            "update_rss_growth_mb": float(peak[1]),
            "rss_before_load_mb": rss_start,
            "trainable_params": trainable,
            "processes": world,
        }
        Path(args.out).write_text(json.dumps(out), encoding="utf-8")
    dist.shutdown()


def run_variant(model: str, procs: int, overrides: list[str], a: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        args = ["--worker", "--model", model, "--out", str(out), "--batch", str(a.batch), "--seq", str(a.seq)]
        args += ["--steps", str(a.steps), "--micro", str(a.micro), "--threads", str(a.threads), *overrides]
        if procs == 1:
            cmd = [sys.executable, "-m", "bench.train", *args]
        else:
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={procs}"]
            cmd += ["-m", "bench.train", *args]
        env = dict(os.environ, CUDA_VISIBLE_DEVICES="", TIRL_QUIET="1", PYTHONPATH=str(ROOT / "src"))
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                cwd=ROOT, start_new_session=True)  # fmt: skip
        try:
            stdout, stderr = proc.communicate(timeout=a.variant_timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # torchrun's workers too
            proc.communicate()
            return {"error": f"timed out after {a.variant_timeout} s (load, warm-up and {a.steps} updates)"}
        if proc.returncode != 0:
            return {"error": (stderr or stdout)[-2000:]}
        return json.loads(out.read_text(encoding="utf-8"))


def tiny_model(directory: Path) -> str:
    save_tiny(directory)
    return str(directory)


def _imported_smollm2() -> str:
    """SmolLM2-135M as bench/engines.py imports it (`make bench` runs that first), when it is there."""
    return str(SMOLLM2_DIR) if (SMOLLM2_DIR / "config.json").is_file() else ""


def bench_model(name: str, model: str, a: argparse.Namespace) -> dict:
    rows: dict[str, dict] = {}
    for label, procs, overrides in VARIANTS:
        print(f"  {name}: {label}", flush=True)
        rows[label] = run_variant(model, procs, overrides, a)
    base = rows["full fp32"]
    for r in rows.values():
        if "error" not in r and "error" not in base:
            r["speed_vs_full_fp32"] = r["tokens_per_s"] / base["tokens_per_s"]
            r["peak_rss_vs_full_fp32"] = r["peak_rss_mb"] / base["peak_rss_mb"]
    return {"model": model, "batch": a.batch, "seq": a.seq, "micro_batch_size": a.micro, "variants": rows}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m bench.train", description=__doc__.splitlines()[0])
    p.add_argument("--worker", action="store_true")
    p.add_argument("--model", default=os.environ.get("TIRL_BENCH_MODEL", "") or _imported_smollm2())
    p.add_argument("--out", default="")
    p.add_argument("--batch", type=int, default=0)
    p.add_argument("--seq", type=int, default=0)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--micro", type=int, default=0)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument(
        "--variant-timeout",
        type=int,
        default=1800,
        help="seconds per variant before it is recorded as too slow",
    )
    p.add_argument("overrides", nargs="*")
    a = p.parse_args(argv)
    if a.worker:
        worker(a)
        return {}
    results: dict = {
        "load_average": os.getloadavg()[0],
        "models": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        tiny = argparse.Namespace(
            **{**vars(a), "batch": a.batch or 32, "seq": a.seq or 256, "micro": a.micro or 8}
        )
        results["models"]["tiny demo Qwen2"] = bench_model("tiny", tiny_model(Path(tmp) / "tiny"), tiny)
    if a.model:
        real = argparse.Namespace(
            **{**vars(a), "batch": a.batch or 4, "seq": a.seq or 256, "micro": a.micro or 2}
        )
        results["models"][Path(a.model).name] = bench_model(Path(a.model).name, a.model, real)
    else:
        results["models"]["local model"] = {"skipped": "no --model DIR / TIRL_BENCH_MODEL given"}
    return results


if __name__ == "__main__":
    res = main()
    if res:  # the parent, not a --worker
        write_result(result_path("train"), res)
        print(json.dumps(res, indent=2))
