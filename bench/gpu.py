"""tirl on one CUDA GPU: decode, the update and the tiny demo's stages, in one JSON that names the device.

Every figure names the precision it ran in, read from the model that ran it (`weights`: the parameters' dtype;
`compute`: autocast's dtype or the weights' own): the Qwen3 config asks for bf16 weights, so each model is built
with its dtype given.

- Decode, Qwen3-0.6B shape (random weights; `tirl plan --arch qwen3-0.6b`), batch 64, 128-token prompts, 256 new
  tokens, sampled at temperature 1: the torch engine over fp32 weights in fp32 and under bf16 autocast (how tirl
  runs it), its CUDA-graph decode under bf16 autocast (`rollout.torch.cuda_graphs=on`) where this checkout has
  it, and HF `generate` with fp32 and with bf16 weights: tokens/s. Each is warmed up by one call of the timed
  length, so that the timed call allocates and captures nothing.
- The update, same shape: 16 sequences of 1,024 to 2,048 tokens (the last three quarters trained), fp32 master
  weights under bf16 autocast, in micro-batches cut by a token budget (`micro_batch_tokens: auto` for the device;
  the padding it leaves beside that of fixed micro-batches of 4): tirl's `accumulate_gradients` + its AdamW step
  against a plain HF forward-with-labels + fused AdamW over the same micro-batches: tokens/s, TFLOP/s counted as
  6 x parameters x real tokens / s (attention FLOPs left out), peak allocated memory, and `tirl plan`'s estimate
  for that update beside tirl's peak.
- The tiny demo on CUDA, shortened (fewer rows and RL steps): seconds per stage from its report.
- `--profile`: where the time goes (`torch.profiler`, one more call after the timed one, so the timed figures
  carry no profiler overhead) for the engine's bf16 decode rows and tirl's update: wall and device-busy
  milliseconds per step, and the ops that took most of each (a step that is host-bound shows a device busy for a
  small share of its wall time).

    python -m bench gpu                       # one GPU: about 5 minutes on an H100
    python -m bench gpu --device cpu --small  # every part at a tiny shape on a CPU, in about a minute
    python -m bench gpu --parts decode,update --profile   # and where their time goes

Without CUDA it refuses unless given `--device cpu --small`. Writes bench/results/gpu.json (`--out`), again after
each part, so that a run cut short keeps what it measured (`--parts` runs some of them).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import inspect
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.common import ROOT, result_path, stopwatch, tirl_env, write_result

FULL = {"decode_batch": 64, "prompt": 128, "new": 256, "batch": 16, "seq": 2048, "steps": 2}
SMALL = {"decode_batch": 4, "prompt": 16, "new": 8, "batch": 4, "seq": 64, "steps": 1}
FIXED_MICRO = 4  # the fixed micro-batch size whose padding the result reports beside the token budget's
PARTS = ("decode", "update", "demo")
PROFILED_DECODE = (
    "torch engine, fp32 weights, bf16 autocast",
    "torch engine CUDA graphs, fp32 weights, bf16 autocast",
)
TOP_OPS = 12
# decode rows: (name, weights, engine keywords; None = HF generate)
DECODE = (
    ("torch engine, fp32 weights, fp32", "float32", {}),
    ("torch engine, fp32 weights, bf16 autocast", "float32", {"compute_dtype": "bfloat16"}),
    ("torch engine CUDA graphs, fp32 weights, bf16 autocast", "float32",
     {"compute_dtype": "bfloat16", "cuda_graphs": "on"}),
    ("HF generate, fp32 weights", "float32", None),
    ("HF generate, bf16 weights", "bfloat16", None),
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


def where_time_goes(run: Any, device: str, steps: int) -> dict:
    """`run()` under `torch.profiler`: wall and device-busy ms per step (the device's kernels' own times summed;
    0 on a CPU) and the `TOP_OPS` ops with the most own time (device time on CUDA, host time on a CPU); where the
    profiler fails, the error in their place."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device == "cuda"
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    try:
        with profile(activities=activities) as prof, stopwatch() as t:
            run()
            sync(device)
    except Exception as e:  # noqa: BLE001 - a profiler that fails must not cost the timed figures beside it
        return {"error": f"{type(e).__name__}: {e}"[:2000]}
    ops = prof.key_averages()
    own = (lambda e: e.self_device_time_total) if cuda else (lambda e: e.self_cpu_time_total)
    top = sorted(ops, key=own, reverse=True)[:TOP_OPS]
    return {
        "steps": steps, "wall_ms_per_step": t.s * 1e3 / steps,
        "device_busy_ms_per_step": sum(e.self_device_time_total for e in ops) / 1e3 / steps,
        "top_ops": [{"op": e.key, "calls": e.count, "self_device_ms": e.self_device_time_total / 1e3,
                     "self_host_ms": e.self_cpu_time_total / 1e3} for e in top],
    }  # fmt: skip


def engine_tok_s(
    model: Any, prompts: list[list[int]], new: int, device: str, profile: bool = False, **kw: Any
) -> dict:
    """The torch engine: a warm-up call of the timed length (its graphs captured, its arena and the allocator
    sized), then the timed one; with `profile`, a third call of that length under the profiler."""
    import torch

    from tirl.rollout.engines.torch.engine import TorchEngine
    from tirl.rollout.sampling import SamplingParams

    vocab = model.config.vocab_size
    engine = TorchEngine(
        model, eos_ids=[vocab - 1], pad_id=0, max_batch_size=len(prompts), keep_prefix_mib=0, **kw
    )
    params = SamplingParams(max_new_tokens=new)
    engine.generate(prompts, params, max_new_tokens=new, generator=torch.Generator().manual_seed(0))
    sync(device)
    captures = getattr(engine.graphs, "captures", 0)
    with stopwatch() as t:
        out = engine.generate(prompts, params, max_new_tokens=new, generator=torch.Generator().manual_seed(1))
        sync(device)
    tokens = sum(len(g.token_ids) for g in out)
    row = {"tokens": tokens, "seconds": t.s, "tokens_per_s": tokens / t.s}
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
    with torch.no_grad():
        if kw is None:
            run = hf_tok_s(model, ids.to(device), dims["new"], device)
        else:
            kw = {**kw, "compute_dtype": autocast}
            run = engine_tok_s(model, ids.tolist(), dims["new"], device, profile, **kw)
    row = {**precision(model, autocast), **run}
    del model
    free(device)
    return row


def decode(cfg: Any, dims: dict, device: str, profile: bool = False) -> dict:
    import torch

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, cfg.vocab_size - 1, (dims["decode_batch"], dims["prompt"]), generator=g)
    rows = {name: decode_row(cfg, dims, device, ids, weights, kw, profile and name in PROFILED_DECODE)
            for name, weights, kw in DECODE}  # fmt: skip
    base = rows["HF generate, bf16 weights"]["tokens_per_s"]
    for r in rows.values():
        if isinstance(r, dict):
            r["vs_hf_generate_bf16"] = r["tokens_per_s"] / base
    return {
        "batch": dims["decode_batch"],
        "prompt_tokens": dims["prompt"],
        "new_tokens": dims["new"],
        "variants": rows,
    }


def free(device: str) -> None:
    import torch

    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def update_batch(cfg: Any, dims: dict, device: str) -> Any:
    """16 (batch) sequences of seq/2 to seq tokens, right-padded, the last three quarters of each trained."""
    import torch

    from tirl.train.batch import TokenBatch

    B, T = dims["batch"], dims["seq"]
    g = torch.Generator().manual_seed(1)
    lengths = torch.randint(T // 2, T + 1, (B,), generator=g)
    ids = torch.randint(0, cfg.vocab_size, (B, T), generator=g)
    attn = (torch.arange(T)[None, :] < lengths[:, None]).long()
    loss_mask = attn.clone()
    loss_mask[:, : T // 4] = 0
    adv = (torch.randn(B, 1, generator=g).expand(B, T) * loss_mask).contiguous()
    return TokenBatch(ids.to(device), attn.to(device), loss_mask.to(device), {"advantages": adv.to(device)})


def timed_steps(step: Any, steps: int, device: str) -> tuple[float, float | None]:
    """(seconds per step after one warm-up step, peak allocated GiB over the timed steps; None on a CPU)."""
    import torch

    step()
    sync(device)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    with stopwatch() as t:
        for _ in range(steps):
            step()
        sync(device)
    peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None
    return t.s / steps, peak


def micro_parts(mini: Any, budget: int, fixed: int = 0) -> list[list[int]]:
    """The rows of each micro-batch: cut by the token `budget` as tirl cuts them (`micro_batches_by_length`), or
    `fixed` rows at a time in order."""
    from tirl.train.batch import micro_batches_by_length

    lengths = mini.attention_mask.sum(dim=-1).tolist()
    return micro_batches_by_length(lengths, max_seqs=fixed, max_tokens=0 if fixed else budget)


def padding_share(mini: Any, parts: list[list[int]]) -> float:
    """The share of the passes' tokens that are padding (each part runs at its longest row)."""
    lengths = mini.attention_mask.sum(dim=-1).tolist()
    padded = sum(len(p) * max(lengths[i] for i in p) for p in parts)
    return 1 - sum(lengths) / padded


def state_dtypes(model: Any, opt: Any) -> dict[str, str]:
    """The dtypes the update kept: parameters and the optimizer's state (AdamW's moments)."""
    import torch

    moments = {str(v.dtype).removeprefix("torch.") for st in opt.state.values() for v in st.values()
               if torch.is_tensor(v) and v.dim() > 0}  # fmt: skip
    return {"params": precision(model)["weights"], "optimizer_state": "/".join(sorted(moments))}


def tirl_update(
    model: Any, mini: Any, dims: dict, device: str, autocast: Any, budget: int, profile: bool = False
) -> tuple:
    from tirl.algorithms import get_policy_loss
    from tirl.train.optim import OptimConfig, build_optimizer, clip_and_step
    from tirl.train.rl.update import LossSpec, accumulate_gradients

    spec = LossSpec(
        get_policy_loss("ppo"), hyper={"clip_low": 0.2, "clip_high": 0.28, "clip_c": 10.0}, agg="token-mean", norm_len=dims["seq"],
        temperature=1.0, micro_batch_tokens=budget, autocast=autocast,
    )  # fmt: skip
    cfg = OptimConfig(lr=1e-6)
    opt, sched = build_optimizer(model, cfg, dims["steps"] + 1)

    def step() -> None:
        stats = accumulate_gradients(model, mini, None, None, spec)
        clip_and_step(model, opt, sched, cfg, loss=stats["loss/total"])

    timed = timed_steps(step, dims["steps"], device)
    return (*timed, opt, where_time_goes(step, device, 1) if profile else None)


def plain_update(
    model: Any, mini: Any, dims: dict, device: str, autocast: Any, budget: int, profile: bool = False
) -> tuple:
    """HF's own loss (forward with labels) per micro-batch (the same rows as tirl's, cut to their longest),
    weighted by its share of the trained tokens, and PyTorch's fused AdamW: what a trainer without tirl's head,
    packing or accounting would run."""
    import torch

    from tirl.train.batch import slice_rows

    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=device == "cuda")
    total = float(mini.loss_mask[:, 1:].sum())
    micros = [slice_rows(mini, rows) for rows in micro_parts(mini, budget)]

    def step() -> None:
        for m in micros:
            with torch.autocast(device, dtype=autocast or torch.bfloat16, enabled=autocast is not None):
                labels = m.input_ids.masked_fill(m.loss_mask == 0, -100)
                out = model(input_ids=m.input_ids, attention_mask=m.attention_mask, labels=labels)
            (out.loss.float() * (float(m.loss_mask[:, 1:].sum()) / total)).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return (*timed_steps(step, dims["steps"], device), opt, None)


def plan_estimate(cfg: Any, dims: dict, device: str, gpu_gib: float, budget: int) -> dict:
    """`tirl plan`'s memory estimate of this update (rl stage, one process, no KL reference)."""
    from tirl.commands.run_config import TirlConfig
    from tirl.core.config import load_config
    from tirl.train.plan import plan

    with tempfile.TemporaryDirectory() as tmp:
        cfg.to_json_file(str(Path(tmp) / "config.json"))
        seq, prompt = dims["seq"], dims["seq"] // 4
        run = load_config(TirlConfig, None, [
            f"model.path={tmp}", f"model.device={device}", "model.dtype=float32", "model.autocast=bfloat16",
            "rl.prompts_per_step=1", f"rl.n={dims['batch']}", f"rl.mini_batch_size={dims['batch']}",
            "rl.micro_batch_size=0", f"rl.micro_batch_tokens={max(budget, seq)}", "rl.kl.coef=0",
            f"agent.max_prompt_tokens={prompt}", f"agent.max_response_tokens={seq - prompt}",
            f"agent.max_tokens_per_turn={seq - prompt}",
        ])  # fmt: skip
        p = plan(run, stage="rl", processes=1, gpu_gib=gpu_gib)
    return {"total_gib": p.total_gib, "activations_gib": p.activations_gib, "logits_gib": p.logits_gib}


def update(cfg: Any, dims: dict, device: str, profile: bool = False) -> dict:
    """fp32 master weights under bf16 autocast (tirl's RL update), on a CPU too (its dry run runs the same path)."""
    import torch

    from tirl.train.memory import resolve_micro_batch_tokens

    autocast = torch.bfloat16
    mini = update_batch(cfg, dims, device)
    tokens = int(mini.attention_mask.sum())
    rows, budget = {}, 0
    for name, fn in (("tirl", tirl_update), ("plain HF", plain_update)):
        model = build(cfg, device, "float32").train()
        budget = budget or resolve_micro_batch_tokens("auto", model, autocast=autocast).tokens
        params = sum(p.numel() for p in model.parameters())
        s, peak, opt, prof = fn(model, mini, dims, device, autocast, budget, profile)
        rows[name] = {**precision(model, autocast), **state_dtypes(model, opt), "seconds_per_update": s,
                      "tokens_per_s": tokens / s, "tflop_per_s": 6 * params * tokens / s / 1e12,
                      "peak_allocated_gib": peak, **({"profile": prof} if prof else {})}  # fmt: skip
        del model, opt
        free(device)
    rows["tirl"]["speed_vs_plain"] = (
        rows["plain HF"]["seconds_per_update"] / rows["tirl"]["seconds_per_update"]
    )
    gpu_gib = torch.cuda.get_device_properties(0).total_memory / 2**30 if device == "cuda" else 80.0
    est = plan_estimate(cfg, dims, device, gpu_gib, budget)
    if rows["tirl"]["peak_allocated_gib"]:
        est["vs_measured_peak"] = est["total_gib"] / rows["tirl"]["peak_allocated_gib"]
    parts = micro_parts(mini, budget)
    return {
        "params": params, "sequences": dims["batch"], "max_tokens": dims["seq"], "real_tokens": tokens,
        "micro_batch_tokens": budget, "micro_batches": len(parts), "padding_share": padding_share(mini, parts),
        f"padding_share_fixed_{FIXED_MICRO}": padding_share(mini, micro_parts(mini, 0, FIXED_MICRO)),
        "flops": "6 x params x real tokens per update", "variants": rows, "tirl_plan_estimate": est,
    }  # fmt: skip


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
    run = {"decode": lambda: decode(cfg, dims, a.device, a.profile),
           "update": lambda: update(cfg, dims, a.device, a.profile),
           "demo": lambda: demo(a.device, a.small)}  # fmt: skip
    for part in parts:  # written after each part: a run cut short keeps what it measured
        result[part] = run[part]()
        write_result(a.out, result)
    print(json.dumps(result, indent=2, default=str))
    upd = result.get("update", {}).get("variants", {}).get("tirl", {})
    ok = math.isfinite(upd.get("tokens_per_s", 0.0)) and "error" not in result.get("demo", {})
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
