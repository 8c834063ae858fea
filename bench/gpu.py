"""tirl on one CUDA GPU: decode, the update and the tiny demo's stages, in one JSON that names the device.

Every figure names the precision it ran in, read from the model that ran it (`weights`: the parameters' dtype;
`compute`: autocast's dtype or the weights' own): the Qwen3 config asks for bf16 weights, so each model is built
with its dtype given.

- Decode, Qwen3-0.6B shape (random weights; `tirl plan --arch qwen3-0.6b`), batch 64, 128-token prompts, 256 new
  tokens, sampled at temperature 1 (an end id past the vocabulary: every row runs to the end): the torch engine
  over fp32 weights in fp32 and under bf16 autocast (how tirl runs it), its CUDA-graph decode under bf16 autocast
  (`rollout.torch.cuda_graphs=on`) where this checkout has it, HF `generate` with fp32 and with bf16 weights, then
  the graph decode with the sampler's earlier draw (one float64 cumulative sum over the whole vocabulary: the
  two-level draw before and after, in one run) and with its step through `torch.compile`
  (`rollout.torch.compile_graph_step`): tokens/s. Each is warmed up by one call of the timed length (`warmup_s`:
  captures and compiles happen there), so that the timed call allocates and captures nothing.
- The update, same shape: 16 sequences of 1,024 to 2,048 tokens (the last three quarters trained), fp32 master
  weights under bf16 autocast, in micro-batches cut by a token budget (`micro_batch_tokens: auto` for the device;
  the padding it leaves beside that of fixed micro-batches of 4): tirl's `accumulate_gradients` + its AdamW step
  against a plain HF forward-with-labels + fused AdamW over the same micro-batches, then tirl's with
  `model.compile_layers` (bench/gpu_update.py): tokens/s, TFLOP/s counted as 6 x parameters x real tokens / s
  (attention FLOPs left out), peak allocated memory, and `tirl plan`'s estimate for that update beside tirl's peak.
- The recipe's Qwen3-4B shape (`decode-4b`, `update-4b`: bench/gpu_recipe.py).
- The tiny demo on CUDA, shortened (fewer rows and RL steps): seconds per stage from its report.
- `--profile`: where the time goes (`torch.profiler`, one more call after the timed one, so the timed figures
  carry no profiler overhead) for the engine's bf16 decode rows and tirl's update: wall and device-busy
  milliseconds per step, the ops that took most of each, and tirl's regions (bench/gpu_profile.py).

    python -m bench gpu                       # one GPU: about 8 minutes on an H100 (estimated)
    python -m bench gpu --device cpu --small  # every part at a tiny shape on a CPU, in about a minute
    python -m bench gpu --parts decode,update --profile   # and where their time goes

Without CUDA it refuses unless given `--device cpu --small`. Writes bench/results/gpu.json (`--out`), again after
each row of a part (`progress`), so that a run cut short keeps what it measured (`--parts` runs some of them).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import inspect
import json
import math
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

from bench.common import ROOT, result_path, stopwatch, tirl_env, write_result
from bench.gpu_profile import TOP_OPS, where_time_goes  # noqa: F401 - TOP_OPS: the tests read it here

FULL = {"decode_batch": 64, "prompt": 128, "new": 256, "batch": 16, "seq": 2048, "steps": 2}
SMALL = {"decode_batch": 4, "prompt": 16, "new": 8, "batch": 4, "seq": 64, "steps": 1}
PARTS = (
    "decode",
    "update",
    "demo",
    "decode-4b",
    "update-4b",
)  # update: bench/gpu_update.py; 4b: gpu_recipe.py
PROFILED_DECODE = (
    "torch engine, fp32 weights, bf16 autocast",
    "torch engine CUDA graphs, fp32 weights, bf16 autocast",
)
# the graph row again with the draw of one float64 cumulative sum over the whole vocabulary (bench/sampler.py's
# baseline, the sampler before its two-level draw): the change measured before and after in one run
BEFORE_SAMPLER = "torch engine CUDA graphs, full-scan draw (before), fp32 weights, bf16 autocast"
# the graph row with its static step through torch.compile (`rollout.torch.compile_graph_step`): the warm-up
# call compiles and captures (its seconds are `warmup_s`)
COMPILED = "torch engine CUDA graphs, compiled step, fp32 weights, bf16 autocast"
# decode rows: (name, weights, engine keywords; None = HF generate)
DECODE = (
    ("torch engine, fp32 weights, fp32", "float32", {}),
    ("torch engine, fp32 weights, bf16 autocast", "float32", {"compute_dtype": "bfloat16"}),
    ("torch engine CUDA graphs, fp32 weights, bf16 autocast", "float32",
     {"compute_dtype": "bfloat16", "cuda_graphs": "on"}),
    ("HF generate, fp32 weights", "float32", None),
    ("HF generate, bf16 weights", "bfloat16", None),
    (BEFORE_SAMPLER, "float32", {"compute_dtype": "bfloat16", "cuda_graphs": "on", "sampler": "full-scan"}),
    (COMPILED, "float32", {"compute_dtype": "bfloat16", "cuda_graphs": "on", "compile_graph_step": True}),
)  # fmt: skip
TINY_SHAPE = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 512}  # fmt: skip
DEMO_FULL = ["task.num_sft=300", "task.num_rl=200", "task.num_test=16", "demo.warmup.epochs=1", "sft.epochs=1",
             "rl.steps=2", "eval.n=1"]  # fmt: skip
DEMO_SMALL = ["task.num_sft=32", "task.num_rl=16", "task.num_test=4", "demo.warmup.epochs=1", "sft.epochs=1",
              "rl.steps=1", "rl.prompts_per_step=4", "rl.n=2", "rl.mini_batch_size=8", "eval.n=1",
              "agent.max_response_tokens=48", "agent.max_tokens_per_turn=24", "reward.overlong_buffer=16"]  # fmt: skip


def model_config(small: bool) -> Any:
    """Qwen3-0.6B's architecture, or at `small` the same family at a tiny width (a CPU runs it in seconds)."""
    from tirl.train.plan import load_arch

    _, cfg = load_arch("", "qwen3-0.6b")
    if small:
        for k, v in TINY_SHAPE.items():
            setattr(cfg, k, v)
        if getattr(cfg, "layer_types", None):
            cfg.layer_types = cfg.layer_types[: cfg.num_hidden_layers]
    return cfg


def build(cfg: Any, device: str, dtype: str) -> Any:
    """The model in `dtype` ("float32", "bfloat16"): given, not left to the config (Qwen3's says bfloat16)."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa", dtype=getattr(torch, dtype))
    weights = {str(p.dtype) for p in model.parameters()}
    assert weights == {f"torch.{dtype}"}, f"asked for {dtype} weights, built {weights}"
    return model


def precision(model: Any, autocast: Any = None) -> dict[str, str]:
    """What a figure ran in, read from its model: the parameters' dtype(s) and the compute dtype."""
    weights = sorted({str(p.dtype).removeprefix("torch.") for p in model.parameters()})
    compute = (
        f"{str(autocast).removeprefix('torch.')} autocast" if autocast is not None else "/".join(weights)
    )
    return {"weights": "/".join(weights), "compute": compute}


def sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def graphs_available() -> str:
    """'' when this checkout's torch engine has the CUDA-graph decode, else why the variant is skipped."""
    from tirl.rollout.engines.torch.config import TorchEngineConfig
    from tirl.rollout.engines.torch.engine import TorchEngine

    if "cuda_graphs" not in {f.name for f in dataclasses.fields(TorchEngineConfig)}:
        return "skipped: rollout.torch.cuda_graphs is not in this checkout"
    if "cuda_graphs" not in inspect.signature(TorchEngine).parameters:
        return "skipped: TorchEngine takes no cuda_graphs argument in this checkout"
    return ""


def engine_tok_s(
    model: Any, prompts: list[list[int]], new: int, device: str, profile: bool = False, **kw: Any
) -> dict:
    """The torch engine: a warm-up call of the timed length (its graphs captured, its arena and the allocator
    sized), then the timed one; with `profile`, a third call of that length under the profiler."""
    import torch

    from tirl.rollout.engines.torch.engine import TorchEngine
    from tirl.rollout.sampling import SamplingParams

    vocab = model.config.vocab_size
    engine = (
        TorchEngine(  # an end id past the vocabulary: every row decodes `new` tokens, one bucket throughout
            model, eos_ids=[vocab], pad_id=0, max_batch_size=len(prompts), keep_prefix_mib=0, **kw
        )
    )
    params = SamplingParams(max_new_tokens=new)
    with stopwatch() as warm:
        engine.generate(prompts, params, max_new_tokens=new, generator=torch.Generator().manual_seed(0))
        sync(device)
    captures = getattr(engine.graphs, "captures", 0)
    with stopwatch() as t:
        out = engine.generate(prompts, params, max_new_tokens=new, generator=torch.Generator().manual_seed(1))
        sync(device)
    tokens = sum(len(g.token_ids) for g in out)
    row = {"tokens": tokens, "seconds": t.s, "tokens_per_s": tokens / t.s, "warmup_s": warm.s}
    if engine.graphs is not None:
        row["captures_in_timed_call"] = engine.graphs.captures - captures
    if profile:
        gen = torch.Generator().manual_seed(2)
        row["profile"] = where_time_goes(lambda: engine.generate(prompts, params, max_new_tokens=new, generator=gen),
                                         device, new)  # fmt: skip
    engine.close()
    return row


def hf_tok_s(model: Any, ids: Any, new: int, device: str) -> dict:
    """HF `generate`, sampling exactly `new` tokens per row (no end-of-sequence id), warmed up at that length."""
    import torch

    kw = {"do_sample": True, "pad_token_id": 0, "eos_token_id": None, "attention_mask": torch.ones_like(ids)}
    model.generate(ids, max_new_tokens=new, min_new_tokens=new, **kw)
    sync(device)
    with stopwatch() as t:
        out = model.generate(ids, max_new_tokens=new, min_new_tokens=new, **kw)
        sync(device)
    tokens = int((out.shape[1] - ids.shape[1]) * ids.shape[0])
    return {"tokens": tokens, "seconds": t.s, "tokens_per_s": tokens / t.s}


def decode_row(
    cfg: Any, dims: dict, device: str, ids: Any, weights: str, kw: dict | None, profile: bool = False
) -> dict | str:
    """One decode figure: `kw` the engine's keywords (None: HF `generate`), on a model built with `weights`."""
    import torch

    if kw is not None and kw.get("cuda_graphs"):
        why = graphs_available() or ("skipped: CUDA graphs need CUDA" if device != "cuda" else "")
        if why:
            return why
    autocast = None if kw is None else getattr(torch, kw["compute_dtype"]) if "compute_dtype" in kw else None
    model = build(cfg, device, weights).eval()
    with torch.no_grad(), sampler((kw or {}).get("sampler", "")):
        if kw is None:
            run = hf_tok_s(model, ids.to(device), dims["new"], device)
        else:
            kw = {k: v for k, v in kw.items() if k != "sampler"} | {"compute_dtype": autocast}
            run = engine_tok_s(model, ids.tolist(), dims["new"], device, profile, **kw)
    row = {**precision(model, autocast), **run}
    del model
    free(device)
    return row


@contextlib.contextmanager
def sampler(name: str) -> Iterator[None]:
    """The engine's draw as it is (""), or the full-scan baseline ("full-scan") for the rows inside."""
    from bench.sampler import old_draw
    from tirl.rollout import sampling

    if name not in ("", "full-scan"):
        raise ValueError(f"unknown sampler {name!r}")
    kept = sampling.draw
    sampling.draw = old_draw if name else kept
    try:
        yield
    finally:
        sampling.draw = kept


def decode(cfg: Any, dims: dict, device: str, profile: bool = False) -> dict:
    import torch

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, cfg.vocab_size - 1, (dims["decode_batch"], dims["prompt"]), generator=g)
    out = {
        "batch": dims["decode_batch"],
        "prompt_tokens": dims["prompt"],
        "new_tokens": dims["new"],
        "variants": {},
    }
    for name, weights, kw in DECODE:  # the compiled row last: its compile is the longest
        prof = profile and name in PROFILED_DECODE
        row = partial(decode_row, cfg, dims, device, ids, weights, kw, prof)
        out["variants"][name] = guarded(row, device)
        progress(out)
    base = out["variants"]["HF generate, bf16 weights"].get("tokens_per_s")
    for r in out["variants"].values():
        if isinstance(r, dict) and base and "tokens_per_s" in r:
            r["vs_hf_generate_bf16"] = r["tokens_per_s"] / base
    return out


def free(device: str) -> None:
    import torch

    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def guarded(run: Any, device: str) -> dict:
    """`run()`, or {"error": ...} where it raised (an out-of-memory error above all): the part goes on, with the
    failed variant's memory freed (its frames go with the exception)."""
    try:
        return run()
    except Exception as e:  # noqa: BLE001 - one variant's failure must not cost the others their figures
        return {"error": f"{type(e).__name__}: {e}"[:2000]}
    finally:
        free(device)


_WRITERS: list[Callable[[dict], None]] = []  # main's, while a part runs


def progress(so_far: dict) -> None:
    """Write what the running part has measured so far as its entry (marked `"partial": true`), so that a
    session that kills the part in the middle keeps its finished rows."""
    for write in _WRITERS:
        write(so_far)


def demo(device: str, small: bool) -> dict:
    """The tiny demo, shortened, on `device`: its report's seconds per stage and the whole wall clock."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "tirl", "demo", f"out_dir={tmp}/demo", f"model.device={device}"]
        cmd += DEMO_SMALL if small else DEMO_FULL
        with stopwatch() as t:
            proc = subprocess.run(cmd, capture_output=True, text=True, env=tirl_env(), cwd=ROOT)
        if proc.returncode:
            return {"error": proc.stderr[-2000:], "command": cmd[3:]}
        report = json.loads((Path(tmp) / "demo" / "report.json").read_text())
    return {"overrides": cmd[5:], "stage_seconds": report["seconds"], "wall_s": t.s}


def versions(device: str) -> dict:
    import torch
    import transformers

    out = {"device": device, "torch": torch.__version__, "transformers": transformers.__version__}
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        out |= {"gpu": props.name, "gpu_memory_gib": props.total_memory / 2**30, "cuda": torch.version.cuda}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.gpu", description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument(
        "--small", action="store_true", help="every part at a tiny shape (about a minute; with --device cpu)"
    )
    ap.add_argument("--parts", default=",".join(PARTS), help=f"which of {', '.join(PARTS)} to run")
    ap.add_argument("--out", default=str(result_path("gpu")))
    ap.add_argument(
        "--profile", action="store_true", help="where decode's and the update's time goes (one more call)"
    )
    a = ap.parse_args(argv)
    parts = [p for p in a.parts.split(",") if p]
    if not parts or set(parts) - set(PARTS):
        print(f"bench/gpu.py: --parts takes some of {', '.join(PARTS)}; got {a.parts!r}", file=sys.stderr)
        return 2
    import torch

    if a.device == "cuda" and not torch.cuda.is_available():
        print(
            "bench/gpu.py: no CUDA device here; on a CPU run `python -m bench gpu --device cpu --small`",
            file=sys.stderr,
        )
        return 2
    if a.device == "cpu" and not a.small:
        print("bench/gpu.py: --device cpu runs the tiny shape only: add --small", file=sys.stderr)
        return 2
    if a.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # tirl's default: fp32 means fp32
    cfg, dims = model_config(a.small), SMALL if a.small else FULL
    result = {
        "machine": versions(a.device),
        "shape": "tiny Qwen3" if a.small else "Qwen3-0.6B (random weights)",
    }
    from bench import gpu_recipe as recipe  # here: they import this module
    from bench.gpu_update import update

    run = {"decode": lambda: decode(cfg, dims, a.device, a.profile),
           "update": lambda: update(cfg, dims, a.device, a.profile),
           "demo": lambda: demo(a.device, a.small),
           "decode-4b": lambda: recipe.decode_4b(a.device, a.small),
           "update-4b": lambda: recipe.update_4b(a.device, a.small)}  # fmt: skip
    for part in parts:  # written after each part, and as a part goes: a run cut short keeps what it measured
        _WRITERS[:] = [
            lambda so_far, part=part: write_result(a.out, {**result, part: {**so_far, "partial": True}})
        ]
        result[part] = run[part]()
        write_result(a.out, result)
    _WRITERS.clear()
    print(json.dumps(result, indent=2, default=str))
    upd = result.get("update", {}).get("variants", {}).get("tirl", {})
    ok = math.isfinite(upd.get("tokens_per_s", 0.0)) and "error" not in result.get("demo", {})
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
