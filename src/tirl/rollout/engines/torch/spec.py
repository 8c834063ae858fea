"""The torch engine's spec (`tirl.rollout.engines.spec`): the policy module itself samples, in the trainer's process."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tirl.rollout.engines.spec import BYTES, GIB, EngineMemory, EngineSpec, MemoryQuery

if TYPE_CHECKING:
    from tirl.rollout.config import RolloutConfig
    from tirl.rollout.engines.base import Engine
    from tirl.rollout.engines.spec import EngineInputs

GRAPH_GPU_SHARE = 0.25  # rollout.torch.graph_kv_gib=0: the arena's share of the GPU (graph_arena.GPU_SHARE)


def build(ro: RolloutConfig, x: EngineInputs) -> Engine:
    import torch

    from tirl.rollout.engines.torch.engine import TorchEngine

    if ro.dtype not in ("auto", "float32", "bfloat16"):
        raise ValueError(
            f"rollout.dtype={ro.dtype!r} with the torch engine: it decodes in float32 or bfloat16 (or auto)"
        )
    compute = {"auto": x.autocast, "bfloat16": torch.bfloat16, "float32": None}[ro.dtype]
    t = ro.torch
    return TorchEngine(
        x.model, eos_ids=[x.eos_id], pad_id=x.pad_id, stop_ids=x.stop_ids, max_batch_size=t.max_batch_size,
        compute_dtype=compute, keep_prefix_mib=t.keep_prefix_mib, compile=t.compile, pack=t.pack,
        cuda_graphs=t.cuda_graphs, graph_kv_gib=t.graph_kv_gib, compile_graph_step=t.compile_graph_step,
    )  # fmt: skip


def memory(q: MemoryQuery) -> EngineMemory:
    """On the trainer's GPU, beside its resident state: the keys and values of the rows decoded at once (a rank's
    trajectories, at most `rollout.torch.max_batch_size`, at full length), the kept prefixes
    (`keep_prefix_mib`, at most), and with CUDA graphs the arena in place of that cache plus a bf16 copy of the
    weights where the decode casts fp32 weights."""
    t = q.rollout.torch
    dtype = {"auto": q.compute_bytes, "bfloat16": 2}.get(q.rollout.dtype, BYTES[q.model_dtype])
    rows = min(-(-q.trajectories // q.world), t.max_batch_size)
    kept = t.keep_prefix_mib / 1024
    if t.cuda_graphs != "off" and not t.compile:
        kv = t.graph_kv_gib or GRAPH_GPU_SHARE * q.gpu_gib
        copy = q.params * 2 / GIB if dtype == 2 and BYTES[q.model_dtype] == 4 else 0.0
        what = f"CUDA-graph arena {kv:.2f} GiB + bf16 weight copy {copy:.2f} GiB"
    else:
        kv = rows * q.sequence_tokens * q.kv_bytes_per_token(dtype) / GIB
        copy = 0.0
        what = f"KV cache of {rows} rows x {q.sequence_tokens} positions {kv:.2f} GiB"
    total = kv + copy + kept
    where = (
        f"in the trainer's process: {what} + kept prefixes {kept:.2f} GiB = {total:.2f} GiB on top of the "
        f"trainer's resident {q.resident_gib:.2f} GiB: {q.resident_gib + total:.2f} GiB of {q.gpu_gib:g}"
    )
    return EngineMemory(total, where, q.resident_gib + total <= q.gpu_gib)


SPEC = EngineSpec("torch", "tirl.rollout.engines.torch.engine:TorchEngine", build, memory)
