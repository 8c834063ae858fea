"""The update part of `python -m bench gpu` (bench/gpu.py's docstring): tirl's RL update (`accumulate_gradients` and
its AdamW step) against a plain HF forward-with-labels and fused AdamW on the same micro-batches, fp32 master weights
under bf16 autocast, with `tirl plan`'s estimate beside the measured peak. bench/gpu_recipe.py runs the same two
updates on the recipe's 4B shape.
"""

from __future__ import annotations

import tempfile
from functools import partial
from pathlib import Path
from typing import Any

from bench import gpu
from bench.common import stopwatch
from bench.gpu_profile import where_time_goes

FIXED_MICRO = 4  # the fixed micro-batch size whose padding the result reports beside the token budget's
COMPILED = "tirl, model.compile_layers"


def update_batch(cfg: Any, dims: dict, device: str, shortest: float = 0.5) -> Any:
    """`batch` sequences of `shortest` x seq to seq tokens, right-padded, the first quarter of seq the prompt (not
    trained), with advantages."""
    import torch

    from tirl.train.batch import TokenBatch

    B, T = dims["batch"], dims["seq"]
    g = torch.Generator().manual_seed(1)
    lengths = torch.randint(int(shortest * T), T + 1, (B,), generator=g)
    ids = torch.randint(0, cfg.vocab_size, (B, T), generator=g)
    attn = (torch.arange(T)[None, :] < lengths[:, None]).long()
    loss_mask = attn.clone()
    loss_mask[:, : T // 4] = 0
    adv = (torch.randn(B, 1, generator=g).expand(B, T) * loss_mask).contiguous()
    return TokenBatch(ids.to(device), attn.to(device), loss_mask.to(device), {"advantages": adv.to(device)})


def timed_steps(step: Any, steps: int, device: str) -> tuple[float, float | None, float]:
    """(seconds per step after one warm-up step, peak allocated GiB over the timed steps (None on a CPU), the
    warm-up step's seconds: compiles included)."""
    import torch

    with stopwatch() as warm:
        step()
        gpu.sync(device)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    with stopwatch() as t:
        for _ in range(steps):
            step()
        gpu.sync(device)
    peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None
    return t.s / steps, peak, warm.s


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
    return {"params": gpu.precision(model)["weights"], "optimizer_state": "/".join(sorted(moments))}


def tirl_update(
    model: Any,
    mini: Any,
    dims: dict,
    device: str,
    autocast: Any,
    budget: int,
    profile: bool = False,
    compile_layers: bool = False,
) -> tuple:
    """tirl's RL update: (seconds per update, peak GiB, warm-up seconds, the optimizer, extra fields: the profile,
    and under `compile_layers` the padded shapes compiled). `compile_layers`: `model.compile_layers` with every
    row padded to the longest length (one shape per micro-batch size: each a compile, in the warm-up update),
    through inductor on CUDA and the `aot_eager` backend on a CPU (the dry run checks the path, not the kernels)."""
    from tirl.algorithms import get_policy_loss
    from tirl.train.compiled import CompiledLayers
    from tirl.train.optim import OptimConfig, build_optimizer, clip_and_step
    from tirl.train.rl.update import LossSpec, accumulate_gradients

    compiled = None
    if compile_layers:
        compiled = CompiledLayers(model, dims["seq"], None if device == "cuda" else {"backend": "aot_eager"})
    spec = LossSpec(
        get_policy_loss("ppo"), hyper={"clip_low": 0.2, "clip_high": 0.28, "clip_c": 10.0}, agg="token-mean", norm_len=dims["seq"],
        temperature=1.0, micro_batch_tokens=budget, autocast=autocast, compiled=compiled,
    )  # fmt: skip
    cfg = OptimConfig(lr=1e-6)
    opt, sched = build_optimizer(model, cfg, dims["steps"] + 1)

    def step() -> None:
        stats = accumulate_gradients(model, mini, None, None, spec)
        clip_and_step(model, opt, sched, cfg, loss=stats["loss/total"])

    timed = timed_steps(step, dims["steps"], device)
    extra = {"profile": where_time_goes(step, device, 1)} if profile else {}
    if compiled is not None:
        extra["compiled_shapes"] = sorted(compiled.shapes)
    return (*timed, opt, extra)


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

    return (*timed_steps(step, dims["steps"], device), opt, {})


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


# (name, the update, whether --profile profiles it)
VARIANTS = (("tirl", tirl_update, True), ("plain HF", plain_update, False),
            (COMPILED, partial(tirl_update, compile_layers=True), False))  # fmt: skip


def update(cfg: Any, dims: dict, device: str, profile: bool = False) -> dict:
    """fp32 master weights under bf16 autocast (tirl's RL update), on a CPU too (its dry run runs the same path)."""
    import torch

    from tirl.train.memory import resolve_micro_batch_tokens

    autocast = torch.bfloat16
    mini = update_batch(cfg, dims, device)
    tokens = int(mini.attention_mask.sum())
    rows: dict[str, Any] = {}
    budget, params = 0, 0
    out = {"sequences": dims["batch"], "max_tokens": dims["seq"], "real_tokens": tokens, "variants": rows}
    # each variant written as it ends; the compiled one, whose compiles take longest, last
    for name, fn, prof in VARIANTS:

        def run(fn: Any = fn, prof: bool = prof and profile) -> dict:
            nonlocal budget, params
            model = gpu.build(cfg, device, "float32").train()
            budget = budget or resolve_micro_batch_tokens("auto", model, autocast=autocast).tokens
            params = sum(p.numel() for p in model.parameters())
            s, peak, warm, opt, extra = fn(model, mini, dims, device, autocast, budget, prof)
            return {**gpu.precision(model, autocast), **state_dtypes(model, opt), "seconds_per_update": s,
                    "tokens_per_s": tokens / s, "tflop_per_s": 6 * params * tokens / s / 1e12,
                    "peak_allocated_gib": peak, "warmup_s": warm, **extra}  # fmt: skip

        rows[name] = gpu.guarded(run, device)
        gpu.progress(out)
    for name in ("tirl", COMPILED):
        if "seconds_per_update" in rows[name] and "seconds_per_update" in rows["plain HF"]:
            rows[name]["speed_vs_plain"] = (
                rows["plain HF"]["seconds_per_update"] / rows[name]["seconds_per_update"]
            )
    gpu_gib = torch.cuda.get_device_properties(0).total_memory / 2**30 if device == "cuda" else 80.0
    est = plan_estimate(cfg, dims, device, gpu_gib, budget)
    if rows["tirl"].get("peak_allocated_gib"):
        est["vs_measured_peak"] = est["total_gib"] / rows["tirl"]["peak_allocated_gib"]
    parts = micro_parts(mini, budget)
    return {
        "params": params, "sequences": dims["batch"], "max_tokens": dims["seq"], "real_tokens": tokens,
        "micro_batch_tokens": budget, "micro_batches": len(parts), "padding_share": padding_share(mini, parts),
        f"padding_share_fixed_{FIXED_MICRO}": padding_share(mini, micro_parts(mini, 0, FIXED_MICRO)),
        "flops": "6 x params x real tokens per update", "variants": rows, "tirl_plan_estimate": est,
    }  # fmt: skip
