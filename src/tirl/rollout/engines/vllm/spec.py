"""The vllm engine's spec (`tirl.rollout.engines.spec`): managed vLLM servers beside the trainer, or one engine
inside each training process (`rollout.vllm.placement`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tirl.rollout.engines.spec import BYTES, GIB, EngineMemory, EngineSpec, MemoryQuery

if TYPE_CHECKING:
    from tirl.rollout.config import RolloutConfig
    from tirl.rollout.engines.base import Engine
    from tirl.rollout.engines.spec import EngineInputs


def build(ro: RolloutConfig, x: EngineInputs) -> Engine:
    """One managed server in one process; under torchrun, or with `rollout.urls`, a pool of servers every rank
    samples from (`tirl.rollout.engines.vllm.pool`); colocated: one sleeping engine per rank."""
    from tirl.models.hub import resolve_model
    from tirl.rollout.engines.vllm.command import VLLMEngineConfig
    from tirl.rollout.engines.vllm.engine import VLLMEngine
    from tirl.rollout.engines.vllm.pool import build_pool, world_size
    from tirl.rollout.engines.vllm.weights import is_plain_hf_dir, servable_dir

    # vLLM serves a directory: a Hub id (the stages pass its snapshot already) becomes its cached snapshot
    model_path = str(resolve_model(x.model_path).path) if x.model_path else ""
    v = ro.vllm
    if v.placement == "colocated":
        from tirl.rollout.engines.vllm.colocated import ColocatedEngine, VLLMBackend, engine_kwargs

        preflight(ro)
        kw = engine_kwargs(v.args, v.kv_cache_gib)
        backend = VLLMBackend(
            model_path, dtype=ro.served_dtype(x.dtype), stop_ids=[x.eos_id, *x.stop_ids], extra=kw
        )
        return ColocatedEngine(backend, eos_ids=[x.eos_id], stop_ids=x.stop_ids)
    wd = x.work_dir / "vllm" if x.work_dir else None
    pooled = bool(ro.urls) or world_size() > 1
    if pooled and not is_plain_hf_dir(model_path):  # a sharded policy cannot be exported by one rank alone
        raise ValueError(
            f"rollout.engine=vllm under torchrun or with rollout.urls serves model.path as it is, and "
            f"{model_path or 'the model'} is no plain Hugging Face directory (config.json, *.safetensors, "
            "tokenizer): export it first with tirl export"
        )
    vcfg = VLLMEngineConfig(
        model=str(servable_dir(model_path, x.model, x.tokenizer, wd)), python=v.python, port=v.port, host=v.host,
        kv_cache_gib=v.kv_cache_gib, dtype=ro.served_dtype(x.dtype), extra_args=list(v.args),
        startup_timeout_s=v.startup_timeout_s, work_dir=str(wd or ""), eos_ids=[x.eos_id],
        stop_ids=list(x.stop_ids), concurrency=ro.concurrency, request_timeout_s=ro.request_timeout_s,
        min_tokens_per_s=ro.min_tokens_per_s, retries=ro.retries, sync=v.sync, sync_host=v.sync_host,
        pause_idle=v.pause_idle,
    )  # fmt: skip
    return build_pool(vcfg, list(ro.urls), ro.model_name) if pooled else VLLMEngine(vcfg)


def preflight(ro: RolloutConfig) -> None:
    """`rollout.vllm.placement=colocated` refused on a machine without a CUDA GPU, before anything is loaded."""
    if ro.vllm.placement != "colocated":
        return
    import torch

    if not torch.cuda.is_available():
        raise ValueError(
            "rollout.vllm.placement=colocated runs one vLLM engine inside each training process on its GPU, and this "
            "machine has no CUDA GPU; use rollout.vllm.placement=separate (vLLM servers beside the trainer), which works "
            "on CPU"
        )


def memory(q: MemoryQuery) -> EngineMemory:
    """Weights in the served dtype (`rollout.dtype`, else `model.dtype`) plus the KV cache (`rollout.vllm.kv_cache_gib`;
    0 = what `--gpu-memory-utilization` in `rollout.vllm.args` leaves, 0.9 by default). `separate`: on GPUs of
    their own (`rollout.urls` servers, else the one rank 0 starts); `colocated`: on each training GPU, asleep during
    the update, awake for rollouts beside the trainer's resident state. The KV cache a step wants: every trajectory
    in flight at its full length."""
    from tirl.rollout.engines.vllm.colocated import engine_kwargs

    ro = q.rollout
    served = BYTES[ro.served_dtype(q.model_dtype)]
    weights = q.params * served / GIB
    separate = ro.vllm.placement == "separate"
    servers = max(len(ro.urls), 1) if separate else q.world
    ranks_each = -(-q.world // servers) if separate else 1  # ranks sending to one engine
    in_flight = min(-(-q.trajectories // servers), ro.concurrency * ranks_each)
    want = in_flight * q.sequence_tokens * q.kv_bytes_per_token(served) / GIB
    utilization = engine_kwargs(ro.vllm.args, 0).get("gpu_memory_utilization", 0.9)
    kv = ro.vllm.kv_cache_gib or utilization * q.gpu_gib - weights
    need = f"KV cache {kv:.2f} GiB (the step's {in_flight} sequences in flight want {want:.2f})"
    total = weights + kv
    if separate:
        where = (
            f"separate: {servers} vLLM server(s) on GPUs of their own beside the {q.world} training GPUs "
            f"({q.world + servers} in all): weights {weights:.2f} GiB + {need} = {total:.2f} GiB each"
        )
        return EngineMemory(total, where, total <= q.gpu_gib)
    where = (
        f"colocated: one engine per training GPU, asleep during the update (its {weights:.2f} GiB of weights in CPU "
        f"memory), awake for rollouts: weights + {need} = {total:.2f} GiB on top of the trainer's resident "
        f"{q.resident_gib:.2f} GiB: {q.resident_gib + total:.2f} GiB of {q.gpu_gib:g}"
    )
    return EngineMemory(total, where, q.resident_gib + total <= q.gpu_gib)


SPEC = EngineSpec("vllm", "tirl.rollout.engines.vllm.engine:VLLMEngine", build, memory, preflight)
