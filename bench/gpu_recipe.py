"""The recipe's model in the GPU benchmark (`python -m bench gpu --parts decode-4b,update-4b`): decode and the
update on the Qwen3-4B shape (bundled arch `qwen3-4b-instruct-2507`, random weights), where bench/gpu.py's own
parts run the 0.6B.

- `decode-4b`: the torch engine's CUDA-graph decode (fp32 weights, bf16 autocast) beside HF `generate` with bf16
  weights, batch 64, with 2,048- and 16,384-token prompts (random ids) in the KV cache, sampled at temperature 1
  over the whole vocabulary (HF's default top-k of 50 turned off). The figure is a decode step alone: after a
  warm-up call of N new tokens (its graphs captured), per-step ms = (seconds of a call with N new tokens -
  seconds of one with 1) / (N - 1), each the fastest of `repeats` calls; decode tokens/s = batch / step. The
  eager engine under bf16 autocast runs on a CPU only (there the graph row is skipped), so that the dry run runs
  the path end to end; on CUDA it is left out to keep the part near 2 minutes on an H100.
- Before a byte is allocated, what each variant holds at its peak (`decode_need`): the engine holds the fp32
  weights, the graphs' bf16 copy of the Linears (the eager engine instead autocast's cache of the same casts,
  alive for the whole call), the arena (batch x `columns(context + N)` positions: the capacity a step runs at)
  and, while a prompt is loaded, its pre-fill's own cache beside the arena and the pre-fill's activations (one
  pass over every row); HF holds bf16 weights, its cache and the pre-fill's activations. Every cache is bf16
  (the engine keeps Qwen3's float32 keys in autocast's dtype: `kv_cache.stored_dtype`). A variant fits where that
  plus `HEADROOM_GIB` is within the card's memory; where batch 64 does not fit for every variant, the context
  runs at the largest power of two that does (the arena's `rollout.torch.graph_kv_gib` given as what that batch
  needs), and both are recorded. A variant that fails
  anyway (an out-of-memory error) is recorded as {"error": ...} and the part goes on.
- The bandwidth floor of a step: (bf16 weight bytes + the KV bytes of the context) / the card's datasheet
  bandwidth, by GPU name (`DATASHEET_TB_PER_S`; None for a GPU not in the table).
- `update-4b`: 16 sequences of 6,144 to 8,192 tokens (the first 2,048 the prompt), fp32 master weights and AdamW
  state under bf16 autocast, micro-batches from `micro_batch_tokens: auto`: tirl's update beside the plain HF
  one (bench/gpu.py's `tirl_update`, `plain_update`), one warm-up and one timed update each. `tirl plan` is
  asked first: without activation checkpointing if that fits the card, else with it if that fits, else the
  variants are skipped with the estimate; its estimate against an 80 GB card and the FSDP processes that would
  fit there are recorded too.

At `--small` (a CPU) the same family at bench/gpu.py's tiny widths: contexts of 32 and 128 tokens at batch 4 and
4 new tokens, and an update of 4 sequences of up to 128 tokens.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from bench import gpu, gpu_update
from bench.common import stopwatch

RECIPE_ARCH = "qwen3-4b-instruct-2507"
DECODE_FULL = {"batch": 64, "contexts": (2048, 16384), "new": 64, "repeats": 1}
DECODE_SMALL = {"batch": 4, "contexts": (32, 128), "new": 4, "repeats": 3}
UPDATE_FULL = {"batch": 16, "seq": 8192, "steps": 1}
UPDATE_SMALL = {"batch": 4, "seq": 128, "steps": 1}
GIB = 1024**3
CARD_80GB_GIB = 79.18  # an H100 80GB HBM3's memory as torch reports it (bench/results/gpu.json: 79.18 GiB)
HEADROOM_GIB = 4.0  # the CUDA context, the allocator's fragmentation and the estimate's error
EAGER_ON_CUDA = False  # the eager engine's row costs ~30 s more on an H100: a CPU dry run only
# HBM bandwidth, TB/s, from the vendors' datasheets: (a part of torch's GPU name, figure); the first match wins
DATASHEET_TB_PER_S = (("H200", 4.8), ("H100 80GB HBM3", 3.35), ("H100 SXM", 3.35), ("A100-SXM4-80GB", 2.0),
                      ("A100 80GB", 2.0))  # fmt: skip
GRAPHS = "torch engine CUDA graphs, fp32 weights, bf16 autocast"
EAGER = "torch engine, fp32 weights, bf16 autocast"
HF = "HF generate, bf16 weights"
FSDP_PROCESSES = (2, 4, 8)


def recipe_config(small: bool) -> Any:
    """The recipe's architecture, or at `small` the same family at bench/gpu.py's tiny widths."""
    from tirl.train.plan import load_arch

    _, cfg = load_arch("", RECIPE_ARCH)
    if small:
        for k, v in gpu.TINY_SHAPE.items():
            setattr(cfg, k, v)
        cfg.layer_types = cfg.layer_types[: cfg.num_hidden_layers]
    return cfg


def param_counts(cfg: Any) -> dict[str, int]:
    """Parameters (a tied embedding once) and the Linears' weights (the LM head too: the graphs' view unties
    it), counted on the meta device."""
    import torch

    from tirl.train.plan import meta_model

    model = meta_model(cfg)
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    return {"params": sum(p.numel() for p in model.parameters()), "linear_params": linear}


def head_dim(cfg: Any) -> int:
    return getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads


def kv_bytes_per_position(cfg: Any, key_bytes: int = 2, value_bytes: int = 2) -> int:
    """One position's keys and values over every layer (bf16 by default)."""
    return cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim(cfg) * (key_bytes + value_bytes)


def prefill_bytes_per_token(cfg: Any, fp32_stream: bool) -> int:
    """A pre-fill's transient activations per token at their peak (one layer's, no grad): the SwiGLU MLP's
    three bf16 tensors alive at once and the residual stream, its normed copy and a bf16 cast (fp32 over fp32
    weights). On a CPU at the 4B widths (one layer, 2,048 to 8,192 tokens) peak RSS grew 82 KiB a token under
    autocast and 70 in bf16, against 82 and 72 here."""
    stream = 10 if fp32_stream else 6
    return 3 * cfg.intermediate_size * 2 + stream * cfg.hidden_size


def decode_need(cfg: Any, counts: dict, context: int, new: int, batch: int) -> dict[str, dict[str, float]]:
    """GiB each decode variant holds at its peak, per part and in total (module docstring)."""
    from tirl.rollout.engines.torch.graph_arena import columns

    kv = kv_bytes_per_position(cfg)  # bf16 keys and values, the pre-fill's cache too (kv_cache.stored_dtype)
    copy = 2 * counts["linear_params"]
    engine_acts = batch * context * prefill_bytes_per_token(cfg, fp32_stream=True)
    parts = {
        GRAPHS: {"fp32_weights": 4 * counts["params"], "bf16_weight_copy": copy,
                 "arena": batch * columns(context + new) * (kv + 1), "prefill_cache": batch * context * kv,
                 "prefill_activations": engine_acts},
        EAGER: {"fp32_weights": 4 * counts["params"], "autocast_weight_cache": copy,
                "kv_cache": batch * (context + new) * kv, "prefill_activations": engine_acts},
        HF: {"bf16_weights": 2 * counts["params"], "kv_cache": batch * (context + new) * kv,
             "prefill_activations": batch * context * prefill_bytes_per_token(cfg, fp32_stream=False)},
    }  # fmt: skip
    return {
        name: {k: v / GIB for k, v in p.items()} | {"total": sum(p.values()) / GIB}
        for name, p in parts.items()
    }


def fits(need_gib: float, card_gib: float) -> bool:
    return need_gib + HEADROOM_GIB <= card_gib


def batch_to_run(
    cfg: Any, counts: dict, context: int, new: int, asked: int, card_gib: float, names: list
) -> int:
    """The largest power of two up to `asked` at which every variant in `names` fits the card; 0 if none."""
    batch = 1 << (asked.bit_length() - 1)
    while batch:
        need = decode_need(cfg, counts, context, new, batch)
        if all(fits(need[n]["total"], card_gib) for n in names):
            return batch
        batch //= 2
    return 0


def card_memory_gib(device: str) -> float:
    """This card's memory: the GPU's, or on a CPU the machine's (MemTotal within the cgroup's limit)."""
    import torch

    from tirl.train.memory import cpu_memory_bytes

    if device == "cuda":
        return torch.cuda.get_device_properties(0).total_memory / GIB
    return (cpu_memory_bytes() or 0) / GIB


def datasheet_bandwidth(device: str) -> tuple[str | None, float | None]:
    """(the GPU's name, its datasheet bandwidth in TB/s or None): not something torch can query."""
    import torch

    if device != "cuda":
        return None, None
    name = torch.cuda.get_device_name(0)
    return name, next((tbs for key, tbs in DATASHEET_TB_PER_S if key.lower() in name.lower()), None)


def peak_reset(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()


def peak_gib(device: str) -> float | None:
    import torch

    return torch.cuda.max_memory_allocated() / GIB if device == "cuda" else None


def step_time(call: Any, new: int, repeats: int, device: str) -> dict:
    """A decode step alone: `call(n, seed)` generates n new tokens a row; one warm-up call of `new`, then the
    fastest of `repeats` calls of 1 and of `new` (module docstring)."""
    call(new, 0)
    gpu.sync(device)
    best = {}
    for n in (1, new):
        times = []
        for r in range(repeats):
            with stopwatch() as t:
                call(n, 1 + r)
                gpu.sync(device)
            times.append(t.s)
        best[n] = min(times)
    return {
        "seconds_1_new": best[1],
        "seconds_n_new": best[new],
        "step_ms": (best[new] - best[1]) * 1e3 / (new - 1),
    }


def engine_call(model: Any, ids: Any, kv_gib: float, kw: dict) -> Any:
    """The torch engine over `model`, as a `step_time` call. Its end-of-sequence id is one the model cannot
    sample (the vocabulary's size), so that every row decodes exactly n tokens."""
    import torch

    from tirl.rollout.engines.torch.engine import TorchEngine
    from tirl.rollout.sampling import SamplingParams

    prompts = ids.tolist()
    engine = TorchEngine(model, eos_ids=[model.config.vocab_size], pad_id=0, max_batch_size=len(prompts),
                         keep_prefix_mib=0, graph_kv_gib=kv_gib, **kw)  # fmt: skip

    def call(n: int, seed: int) -> None:
        out = engine.generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=n), max_new_tokens=n,
                              generator=torch.Generator().manual_seed(seed))  # fmt: skip
        assert all(len(g.token_ids) == n for g in out), "a row stopped early"

    call.close = engine.close  # its graphs, their pool and the arena
    return call


def hf_call(model: Any, ids: Any) -> Any:
    """HF `generate` sampling exactly n tokens a row at temperature 1 over the whole vocabulary."""
    import torch

    kw = {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0, "pad_token_id": 0,
          "eos_token_id": None, "attention_mask": torch.ones_like(ids)}  # fmt: skip

    def call(n: int, seed: int) -> None:
        torch.manual_seed(seed)
        out = model.generate(ids, max_new_tokens=n, min_new_tokens=n, **kw)
        assert out.shape[1] == ids.shape[1] + n, "generate stopped early"

    return call


def decode_variant(cfg: Any, dims: dict, device: str, name: str, ids: Any, kv_gib: float) -> dict:
    """One variant's step time, its precision and peak memory (on a model of its own)."""
    import torch

    weights, kw = {n: (w, k) for n, w, k in gpu.DECODE}[name]
    autocast = getattr(torch, kw["compute_dtype"]) if kw and "compute_dtype" in kw else None
    peak_reset(device)
    model = gpu.build(cfg, device, weights).eval()
    with torch.no_grad():
        if kw is None:
            call = hf_call(model, ids.to(device))
        else:
            call = engine_call(model, ids, kv_gib, {**kw, "compute_dtype": autocast})
        try:
            timing = step_time(call, dims["new"], dims["repeats"], device)
        finally:
            getattr(call, "close", lambda: None)()
    tok_s = ids.shape[0] * 1e3 / timing["step_ms"] if timing["step_ms"] > 0 else None
    return {**gpu.precision(model, autocast), **timing, "decode_tokens_per_s": tok_s,
            "peak_allocated_gib": peak_gib(device)}  # fmt: skip


def decode_context(
    cfg: Any, counts: dict, dims: dict, device: str, context: int, card: float, tbs: Any
) -> dict:
    """One context: the memory arithmetic at the batch asked, the batch run, each variant's step time beside
    HF's and the bandwidth floor."""
    import torch

    from tirl.rollout.engines.torch.graph_arena import columns

    new, asked = dims["new"], dims["batch"]
    skip = gpu.graphs_available() or ("skipped: CUDA graphs need CUDA" if device != "cuda" else "")
    names = [n for n in (GRAPHS, EAGER, HF) if n != EAGER or device != "cuda" or EAGER_ON_CUDA]
    running = [n for n in names if n != GRAPHS or not skip]
    need = decode_need(cfg, counts, context, new, asked)
    batch = batch_to_run(cfg, counts, context, new, asked, card, running)
    kv = kv_bytes_per_position(cfg)
    kv_gib = (context + new) * kv / GIB  # one row's
    out = {"context_tokens": context, "batch_asked": asked, "batch_run": batch,
           "kv_gib_at_asked": asked * kv_gib, "kv_gib_at_run": batch * kv_gib,
           "graph_step_columns": columns(context + new), "need_gib_at_asked": need,
           "fits_80gb": {n: fits(need[n]["total"], CARD_80GB_GIB) for n in need},
           "fits_this_card": {n: fits(need[n]["total"], card) for n in need}}  # fmt: skip
    if not batch:
        why = f"skipped: batch 1 does not fit {card:.1f} GiB with {HEADROOM_GIB:g} GiB of headroom"
        return out | {"variants": {n: why for n in names}}
    at_run = decode_need(cfg, counts, context, new, batch)
    arena_gib = at_run[GRAPHS]["arena"] + 2**-10  # the arena the batch run needs, and a MiB
    floor = (2 * counts["params"] + batch * context * kv) / (tbs * 1e12) * 1e3 if tbs else None
    ids = torch.randint(1, cfg.vocab_size - 1, (batch, context), generator=torch.Generator().manual_seed(0))
    rows: dict[str, Any] = {GRAPHS: skip} if skip else {}
    for n in running:
        rows[n] = gpu.guarded(lambda n=n: decode_variant(cfg, dims, device, n, ids, arena_gib), device)
    hf_ms = rows[HF].get("step_ms")
    for r in rows.values():
        if isinstance(r, dict) and r.get("step_ms"):
            r["vs_hf_generate"] = hf_ms / r["step_ms"] if hf_ms else None
            r["bandwidth_floor_share"] = floor / r["step_ms"] if floor else None
    return out | {
        "need_gib_at_run": at_run,
        "graph_kv_gib": arena_gib,
        "bandwidth_floor_ms": floor,
        "variants": rows,
    }


def decode_4b(device: str, small: bool, card_gib: float = 0.0) -> dict:
    """The `decode-4b` part (module docstring); `card_gib` overrides the card's memory (0: this card's)."""
    cfg, dims = recipe_config(small), DECODE_SMALL if small else DECODE_FULL
    counts = param_counts(cfg)
    card = card_gib or card_memory_gib(device)
    name, tbs = datasheet_bandwidth(device)
    contexts: dict[str, dict] = {}
    out = {"contexts": contexts}
    for c in dims["contexts"]:  # each context's figures written as it ends (bench.gpu.progress)
        contexts[str(c)] = decode_context(cfg, counts, dims, device, c, card, tbs)
        gpu.progress(out)
    return {
        "arch": RECIPE_ARCH + (" at tiny widths" if small else ""), "weights": "random", **counts,
        "kv_bytes_per_position": kv_bytes_per_position(cfg), "new_tokens": dims["new"], "card_gib": card,
        "headroom_gib": HEADROOM_GIB, "card_80gb_gib": CARD_80GB_GIB,
        "step_ms": f"(s of a call of {dims['new']} new tokens - s of a call of 1) / {dims['new'] - 1}, "
                   f"fastest of {dims['repeats']}, after a warm-up call; decode tokens/s = batch_run / step",
        "bandwidth": {"gpu": name, "tb_per_s": tbs, "source": "the datasheet figure by GPU name, not measured"},
        "contexts": contexts,
    }  # fmt: skip


def recipe_plan(
    cfg: Any, dims: dict, device: str, gpu_gib: float, checkpointing: bool, processes: int = 1
) -> Any:
    """`tirl plan`'s estimate of this update (rl stage, no KL reference, `micro_batch_tokens: auto`) on
    `processes` processes (FSDP beyond one): bench/gpu.py's `plan_estimate` with checkpointing and processes."""
    from tirl.commands.run_config import TirlConfig
    from tirl.core.config import load_config
    from tirl.train.plan import plan

    with tempfile.TemporaryDirectory() as tmp:
        cfg.to_json_file(str(Path(tmp) / "config.json"))
        seq, prompt = dims["seq"], dims["seq"] // 4
        run = load_config(TirlConfig, None, [
            f"model.path={tmp}", f"model.device={device}", "model.dtype=float32", "model.autocast=bfloat16",
            f"model.gradient_checkpointing={str(checkpointing).lower()}", f"rl.prompts_per_step={processes}",
            f"rl.n={dims['batch'] // processes}", f"rl.mini_batch_size={dims['batch']}",
            "rl.micro_batch_size=0", "rl.micro_batch_tokens=auto", "rl.kl.coef=0",
            f"agent.max_prompt_tokens={prompt}", f"agent.max_response_tokens={seq - prompt}",
            f"agent.max_tokens_per_turn={seq - prompt}",
        ])  # fmt: skip
        return plan(run, stage="rl", processes=processes, gpu_gib=gpu_gib)


def plan_summary(p: Any, card: float) -> dict:
    return {"total_gib": p.total_gib, "activations_gib": p.activations_gib, "logits_gib": p.logits_gib,
            "tokens_per_micro_batch": p.tokens_per_micro_batch, "fits": p.total_gib <= card}  # fmt: skip


def fsdp_80gb(cfg: Any, dims: dict) -> dict:
    """The fewest FSDP processes (of `FSDP_PROCESSES`) whose per-process estimate, without checkpointing, fits
    an 80 GB card; each process takes a whole share of the sequences (at least two: one GRPO group)."""
    from tirl.train.plan import PlanError

    for w in (w for w in FSDP_PROCESSES if dims["batch"] % w == 0 and dims["batch"] // w >= 2):
        try:
            p = recipe_plan(cfg, dims, "cuda", CARD_80GB_GIB, False, w)
        except PlanError:
            continue
        if p.total_gib <= CARD_80GB_GIB:
            return {"processes": w, "checkpointing": False, "total_gib_per_process": p.total_gib}
    return {"processes": None, "tried": list(FSDP_PROCESSES)}


def update_variant(cfg: Any, dims: dict, device: str, fn: Any, checkpointing: bool, mini: Any) -> dict:
    """One update variant (bench/gpu.py's `tirl_update` or `plain_update`) on a model of its own."""
    import torch

    from tirl.models.loading import enable_gradient_checkpointing
    from tirl.train.memory import resolve_micro_batch_tokens

    autocast, tokens = torch.bfloat16, int(mini.attention_mask.sum())
    peak_reset(device)
    model = gpu.build(cfg, device, "float32").train()
    if checkpointing:
        enable_gradient_checkpointing(model)
    budget = resolve_micro_batch_tokens("auto", model, autocast=autocast).tokens
    params = sum(p.numel() for p in model.parameters())
    s, peak, _, opt, _ = fn(model, mini, dims, device, autocast, budget)
    return {**gpu.precision(model, autocast), **gpu_update.state_dtypes(model, opt), "micro_batch_tokens": budget,
            "micro_batches": len(gpu_update.micro_parts(mini, budget)), "seconds_per_update": s,
            "tokens_per_s": tokens / s, "tflop_per_s": 6 * params * tokens / s / 1e12,
            "peak_allocated_gib": peak}  # fmt: skip


def update_4b(device: str, small: bool, card_gib: float = 0.0) -> dict:
    """The `update-4b` part (module docstring); `card_gib` overrides the card's memory (0: this card's)."""
    cfg, dims = recipe_config(small), UPDATE_SMALL if small else UPDATE_FULL
    card = card_gib or card_memory_gib(device)
    est = {c: recipe_plan(cfg, dims, device, card, c) for c in (False, True)}
    ckpt = next((c for c in (False, True) if est[c].total_gib <= card), None)
    eighty = {c: recipe_plan(cfg, dims, "cuda", CARD_80GB_GIB, c) for c in (False, True)}
    B, T = dims["batch"], dims["seq"]
    both = (("without_checkpointing", False), ("with_checkpointing", True))
    out = {
        "arch": RECIPE_ARCH + (" at tiny widths" if small else ""), "params": param_counts(cfg)["params"],
        "sequences": B, "lengths": f"{3 * T // 4:,} to {T:,} tokens, right-padded, the first {T // 4:,} the "
                                   "prompt (not trained)",
        "card_gib": card, "activation_checkpointing": ckpt,
        "tirl_plan_estimate": {k: plan_summary(est[c], card) for k, c in both},
        "tirl_plan_80gb": {k: plan_summary(eighty[c], CARD_80GB_GIB) for k, c in both},
        "fsdp_80gb": fsdp_80gb(cfg, dims), "flops": "6 x params x real tokens per update",
    }  # fmt: skip
    out["fits_80gb"] = {k: v["fits"] for k, v in out["tirl_plan_80gb"].items()}
    names = (("tirl", gpu_update.tirl_update), ("plain HF", gpu_update.plain_update))
    if ckpt is None:
        why = f"tirl plan estimates {est[True].total_gib:.1f} GiB > {card:.1f} GiB on this card"
        return out | {"variants": {n: {"skipped": why} for n, _ in names}}
    mini = gpu_update.update_batch(cfg, dims, device, shortest=0.75)
    rows: dict[str, dict] = {}
    for n, fn in names:  # tirl's first; each written as it ends (bench.gpu.progress)
        rows[n] = gpu.guarded(lambda fn=fn: update_variant(cfg, dims, device, fn, ckpt, mini), device)
        gpu.progress(out | {"variants": rows})
    tirl, plain = rows["tirl"], rows["plain HF"]
    if tirl.get("peak_allocated_gib"):
        tirl["plan_vs_measured_peak"] = est[ckpt].total_gib / tirl["peak_allocated_gib"]
    if "seconds_per_update" in tirl and "seconds_per_update" in plain:
        tirl["speed_vs_plain"] = plain["seconds_per_update"] / tirl["seconds_per_update"]
    return out | {"real_tokens": int(mini.attention_mask.sum()), "variants": rows}
