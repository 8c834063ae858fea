"""Generation throughput: tirl's batched KV-cache engine against one-prompt-at-a-time decoding, same model, same run.

Writes bench/results/engine.json. The model is the tiny demo architecture (random weights: speed only).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from conftest import build_test_tokenizer  # noqa: E402
from tirl.chat.template import ChatRenderer  # noqa: E402
from tirl.io import atomic_write_json  # noqa: E402
from tirl.models.tiny import TinyModelConfig, build_model, count_parameters  # noqa: E402
from tirl.rollout.engine import TorchEngine  # noqa: E402
from tirl.rollout.sampling import SamplingParams  # noqa: E402


def main() -> dict:
    torch.set_num_threads(2)
    tok = build_test_tokenizer()
    model = build_model(
        tok,
        TinyModelConfig(hidden_size=192, intermediate_size=576, num_layers=2, num_heads=6, num_kv_heads=6),
    ).eval()
    renderer = ChatRenderer(tok)
    prompts = [
        renderer.prompt_ids([{"role": "user", "content": f"What is {1000 + 7 * i} * {37 + i}?"}])
        for i in range(64)
    ]
    engine = TorchEngine(model, eos_ids=[10**9], pad_id=tok.pad_token_id)  # no EOS: every sequence runs to 64
    params = SamplingParams(max_new_tokens=64)
    results = {"model_params": count_parameters(model), "prompts": len(prompts), "new_tokens_each": 64}
    for name, batch in (("batched_kv_cache", len(prompts)), ("one_at_a_time_kv_cache", 1)):
        engine.max_batch_size = batch
        engine.generate(prompts[:2], params, generator=torch.Generator().manual_seed(0))  # warm-up
        t = time.perf_counter()
        gens = engine.generate(prompts, params, generator=torch.Generator().manual_seed(0))
        dt = time.perf_counter() - t
        results[name] = {"seconds": dt, "tokens_per_s": sum(len(g.token_ids) for g in gens) / dt}
    results["speedup"] = (
        results["batched_kv_cache"]["tokens_per_s"] / results["one_at_a_time_kv_cache"]["tokens_per_s"]
    )
    return results


if __name__ == "__main__":
    res = main()
    atomic_write_json(Path(__file__).parent / "results" / "engine.json", res)
    print(json.dumps(res, indent=2))
