"""One RL policy update (forward + backward + AdamW) on the demo's model shape: float32 (the baseline), autocast
bfloat16 (float32 master weights), and LoRA rank 16, each timed in the same run, interleaved.

Writes bench/results/precision.json. The batch is the demo's mini-batch shape scaled down (32 sequences of 160
tokens, 128 trained); times are medians over repeats. It measures the CPU this runs on: whether bf16 autocast helps
depends on the CPU's bf16 instructions (AVX512-BF16/AMX), which is why the demo keeps it off unless this says so.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

import torch

from tirl.algorithms import get_policy_loss
from tirl.io import atomic_write_json
from tirl.models.lora import LoraConfig, apply_lora, parameter_counts
from tirl.models.tiny import TinyModelConfig, build_model
from tirl.train.batch import collate
from tirl.train.optim import OptimConfig, build_optimizer, clip_and_step
from tirl.train.update import LossSpec, accumulate_gradients

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from conftest import build_test_tokenizer  # noqa: E402

DEMO = TinyModelConfig(hidden_size=192, intermediate_size=576, num_layers=2, num_heads=6, num_kv_heads=6)


def _batch(tokenizer, B=32, T=160):
    g = torch.Generator().manual_seed(0)
    ids = [torch.randint(3, 500, (T,), generator=g).tolist() for _ in range(B)]
    masks = [[0] * 32 + [1] * (T - 32) for _ in range(B)]
    adv = [[float(torch.randn(1, generator=g))] * T for _ in range(B)]
    return collate(ids, masks, pad_id=tokenizer.pad_token_id, extra={"advantages": adv})


def _variant(tokenizer, name):
    model = build_model(tokenizer, DEMO, seed=0).train()
    if name == "lora_r16":
        model = apply_lora(model, LoraConfig(rank=16)).train()
    spec = LossSpec(
        get_policy_loss("ppo"), clip_low=0.2, clip_high=0.28, clip_c=10.0, agg="token-mean", norm_len=256,
        temperature=1.0, autocast=torch.bfloat16 if name == "autocast_bf16" else None,
    )  # fmt: skip
    opt, sched = build_optimizer(model, OptimConfig(lr=1e-4), 100)
    return model, spec, opt, sched


def main(repeats: int = 5) -> dict:
    torch.set_num_threads(os.cpu_count() or 1)
    tokenizer = build_test_tokenizer()
    batch = _batch(tokenizer)
    names = ["fp32", "autocast_bf16", "lora_r16"]
    setups = {n: _variant(tokenizer, n) for n in names}
    times: dict[str, list[float]] = {n: [] for n in names}
    losses: dict[str, float] = {}
    for r in range(repeats + 1):  # the first round warms up
        for n in names:
            model, spec, opt, sched = setups[n]
            t0 = time.perf_counter()
            stats = accumulate_gradients(model, batch, None, None, spec)
            clip_and_step(model, opt, sched, OptimConfig(lr=1e-4), loss=stats["loss/total"])
            if r:
                times[n].append(time.perf_counter() - t0)
            losses[n] = stats["loss/total"]
    out = {
        "machine": f"{os.cpu_count()}-core CPU box, torch {torch.__version__}",
        "batch": {"sequences": 32, "tokens": 160, "trained_tokens_per_sequence": 128},
        "model": "demo shape (hidden 192, 2 layers), vocabulary 512",
        "baseline": "fp32",
    }
    for n in names:
        med = statistics.median(times[n])
        trainable, total = parameter_counts(setups[n][0])
        out[n] = {
            "update_s_median": round(med, 4),
            "update_s_all": [round(t, 4) for t in times[n]],
            "speedup_vs_fp32": round(statistics.median(times["fp32"]) / med, 3),
            "trainable_share": round(trainable / total, 4),
            "last_loss": losses[n],
        }
    return out


if __name__ == "__main__":
    result = main()
    path = Path(__file__).parent / "results" / "precision.json"
    atomic_write_json(path, result)
    print(result)
