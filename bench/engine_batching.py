"""Generation throughput: tirl's batched KV-cache engine against one-prompt-at-a-time decoding, same model, same run.

The model is the tiny demo architecture (random weights: speed only); 64 prompts, 64 new tokens each, no EOS, 2
torch threads. Writes bench/results/engine_batching.json, or `--out`.
"""

from __future__ import annotations

import argparse
import json

import torch

from bench.common import arithmetic_prompts, result_path, stopwatch, tiny_model, tiny_tokenizer, write_result
from tirl.chat.template import ChatRenderer
from tirl.models.tiny import count_parameters
from tirl.rollout.engines.torch.engine import TorchEngine
from tirl.rollout.sampling import SamplingParams


def measure() -> dict:
    torch.set_num_threads(2)
    tok = tiny_tokenizer()
    model = tiny_model(tok).eval()
    prompts = arithmetic_prompts(ChatRenderer(tok), 64)
    engine = TorchEngine(model, eos_ids=[10**9], pad_id=tok.pad_token_id)  # no EOS: every sequence runs to 64
    params = SamplingParams(max_new_tokens=64)
    results = {"model_params": count_parameters(model), "prompts": len(prompts), "new_tokens_each": 64}
    for name, batch in (("batched_kv_cache", len(prompts)), ("one_at_a_time_kv_cache", 1)):
        engine.max_batch_size = batch
        engine.generate(prompts[:2], params, generator=torch.Generator().manual_seed(0))  # warm-up
        with stopwatch() as t:
            gens = engine.generate(prompts, params, generator=torch.Generator().manual_seed(0))
        results[name] = {"seconds": t.s, "tokens_per_s": sum(len(g.token_ids) for g in gens) / t.s}
    results["speedup"] = (
        results["batched_kv_cache"]["tokens_per_s"] / results["one_at_a_time_kv_cache"]["tokens_per_s"]
    )
    return results


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.engine_batching", description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(result_path("engine_batching")))
    args = ap.parse_args(argv)
    res = measure()
    write_result(args.out, res)
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
