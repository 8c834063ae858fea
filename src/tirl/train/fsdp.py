"""FSDP2 (`torch.distributed.fsdp.fully_shard`) for the trainers: sharding, generation, idle passes, full weights.

Each decoder layer (the model's `_no_split_modules` classes) is one FSDP unit, the root (embeddings, final norm,
LM head) another. Gradients are reduced with SUM, never AVG: the trainers already divide every micro-batch's loss
by the mini-batch's global token or sequence count (`tirl.train.rl.update`), so the sum over ranks of the local
gradients is the mini-batch's gradient. Forcing SUM also keeps clear of gloo's AVG reduce-scatter, which summed
instead of averaging in some torch versions (pytorch issue 162338; torch 2.13 here averages correctly, and the
tests compare with a single-process gradient either way).

Every forward and backward of a sharded model is a collective: all ranks must run the same sequence of them.
Two consequences handled here:
- Generation (rollouts) runs a different number of decode steps on every rank, so `gathered` all-gathers the
  whole model once and keeps it unsharded while the engine samples; no collective runs until it reshards.
- A rank with fewer micro-batches (or none) runs idle passes, which touch every parameter with zero gradient:
  `MicroBatchPasses`, the one micro-batch loop of both trainers, adds them.

Everything that depends on whether a model is sharded is decided here or in the checkpoint's writer and reader
(`tirl.train.checkpoint_write`, `tirl.train.checkpoint_read`): trainers call `shard`, `gathered`,
`MicroBatchPasses` and `save_model` alike in one process and under torchrun.

Not here: mixed-precision policies and CPU offload (`MixedPrecisionPolicy`, `CPUOffloadPolicy`) -- the CPU tests
cannot check them -- and tensor/sequence parallelism.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch.distributed.fsdp import FSDPModule

from tirl.models.loading import tied_aliases
from tirl.train import dist
from tirl.train.batch import TokenBatch, micro_batches_by_length, slice_rows
from tirl.train.logprobs import shares_prefixes


def fsdp_modules(model: torch.nn.Module) -> list[FSDPModule]:
    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def is_sharded(model: torch.nn.Module) -> bool:
    return isinstance(model, FSDPModule)


def shard(model: torch.nn.Module, *, reshard_after_forward: bool = True) -> torch.nn.Module:
    """Under torchrun, `shard_model` over the ranks; in one process the model itself, untouched."""
    if dist.is_distributed():
        shard_model(model, reshard_after_forward=reshard_after_forward)
    return model


def shard_model(model: torch.nn.Module, *, reshard_after_forward: bool = True) -> torch.nn.Module:
    """Shard `model` in place over all ranks (one FSDP unit per decoder layer, then the root); returns it.

    The device mesh is built explicitly on the parameters' device type ("cpu" under gloo), as FSDP2 would
    otherwise default to a CUDA mesh whenever CUDA is visible."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    names = set(getattr(model, "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise ValueError(
            f"{type(model).__name__} names no decoder-layer classes (_no_split_modules); FSDP needs them to shard "
            "layer by layer"
        )
    device_type = next(model.parameters()).device.type
    mesh = init_device_mesh(device_type, (dist.world_size(),))
    for layer in layers:
        fully_shard(layer, mesh=mesh, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward)
    for m in fsdp_modules(model):
        m.set_force_sum_reduction_for_comms(True)
        m.set_gradient_divide_factor(1.0)
    model._tirl_reshard_after_forward = reshard_after_forward  # what `gathered` restores
    return model


@contextmanager
def gathered(model: torch.nn.Module) -> Iterator[None]:
    """Inside, every parameter is whole on every rank and forwards run no collective (each rank may run any
    number of them: rollouts); on exit the model is sharded again. A no-op for an unsharded model.

    Costs one model's worth of memory per rank while it lasts: the price of sampling without a rollout server.
    """
    mods = fsdp_modules(model)
    if not mods:
        yield
        return
    for m in mods:
        m.set_reshard_after_forward(False, recurse=False)
        m.unshard()
    try:
        yield
    finally:
        for m in mods:
            m.reshard()
            # FSDP never reshards the root after forward (its backward comes next); the layers get the setting back
            m.set_reshard_after_forward(
                m is not model and getattr(model, "_tirl_reshard_after_forward", True), recurse=False
            )


def idle_pass(model: torch.nn.Module, device: torch.device | str) -> None:
    """One forward and backward with zero gradient: what a rank with no micro-batch left runs so that its
    collectives match the other ranks' (every parameter takes part, as in a real micro-batch)."""
    ids = torch.zeros((1, 1), dtype=torch.long, device=device)
    out = model(input_ids=ids, attention_mask=torch.ones_like(ids))
    (out.logits.float().sum() * 0.0).backward()


def idle_forward(model: torch.nn.Module, device: torch.device | str) -> None:
    """A one-token forward whose result is dropped: `idle_pass` without the backward, for no-grad passes."""
    ids = torch.zeros((1, 1), dtype=torch.long, device=device)
    model(input_ids=ids, attention_mask=torch.ones_like(ids))


def matched_parts(model: torch.nn.Module, parts: list[list[int]]) -> list[list[int] | None]:
    """`parts` with None appended up to the busiest rank's count when `model` is sharded: each forward of a
    sharded model is a collective, so every rank runs as many (a None part is an idle pass); `parts` otherwise."""
    if not is_sharded(model):
        return list(parts)
    return [*parts, *[None] * (dist.all_reduce_max(len(parts)) - len(parts))]


def batch_parts(
    model: torch.nn.Module, batch: TokenBatch, *, max_seqs: int, max_tokens: int, share_prefix: bool
) -> list[list[int]]:
    """`batch`'s rows cut into passes (`micro_batches_by_length`), a prompt's rows kept together when they will
    share its pass (`share_prefix`, the batch has prompt lengths and the model can: `shares_prefixes`)."""
    lengths = batch.attention_mask.sum(dim=-1).tolist()
    prefixes = None
    if share_prefix and batch.prefix_len is not None and shares_prefixes(model):
        prefixes = (batch.prefix_keys(), batch.prefix_len.tolist())
    return micro_batches_by_length(lengths, max_seqs=max_seqs, max_tokens=max_tokens, prefixes=prefixes)


class MicroBatchPasses:
    """The forward/backward passes of one batch on this rank: iterating yields (rows, micro-batch) for each
    micro-batch (`tirl.train.batch.micro_batches_by_length`) and runs the idle passes a sharded model needs in
    between.

    `batch` None: this rank has no rows of this batch. For a sharded model every rank runs as many passes as the
    busiest one (they are collectives), and a micro-batch without a trained token becomes an idle pass too; in one
    process the micro-batches are exactly `micro_batches_by_length`'s. `len()` counts the passes, idle ones
    included.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        batch: TokenBatch | None,
        *,
        max_seqs: int = 0,
        max_tokens: int = 0,
        share_prefix: bool = False,
    ) -> None:
        self.model, self.batch = model, batch
        parts: list[list[int]] = []
        if batch is not None:
            parts = batch_parts(
                model, batch, max_seqs=max_seqs, max_tokens=max_tokens, share_prefix=share_prefix
            )
        self.sharded = is_sharded(model)
        self.parts = matched_parts(model, parts)

    def __len__(self) -> int:
        return len(self.parts)

    def __iter__(self) -> Iterator[tuple[list[int], TokenBatch]]:
        for rows in self.parts:
            micro = None if rows is None else slice_rows(self.batch, rows)
            if micro is None or (self.sharded and not bool((micro.loss_mask[:, 1:] > 0).any())):
                idle_pass(self.model, next(self.model.parameters()).device)  # the collectives must run
                continue
            yield rows, micro


def full_state_dict(model: torch.nn.Module, *, trainable_only: bool = False) -> dict[str, torch.Tensor]:
    """The whole model's weights on rank 0, in CPU memory ({} on the other ranks). Collective.

    `trainable_only`: only the parameters that train (a LoRA adapter: megabytes, where the base is gigabytes)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=trainable_only)
    state = get_model_state_dict(model, options=options)
    return {k: v for k, v in state.items() if k not in tied_aliases(model)}


def save_model(
    model: torch.nn.Module, tokenizer: Any, path: str | Path, *, extra: dict | None = None
) -> Path:
    """The trained model as a plain Hugging Face directory (a LoRA model: its adapter and base record), whole or
    sharded alike: a sharded one is gathered to rank 0 (`save_full_model`, collective: every rank calls)."""
    if is_sharded(model):
        save_full_model(model, tokenizer, path, extra=extra)
        return Path(path)
    from tirl.models.loading import save_checkpoint

    return save_checkpoint(model, tokenizer, path, extra=extra)


def save_full_model(model: torch.nn.Module, tokenizer: Any, path: Any, *, extra: dict | None = None) -> None:
    """A plain Hugging Face directory from a sharded model: full weights gathered to rank 0, written there
    atomically; every rank returns once it exists. Collective. A LoRA model is written as one process writes it:
    the adapter alone (gathered) and the record of its base (`tirl.models.lora.save_model`)."""
    from tirl.core.io import atomic_dir
    from tirl.models import lora

    adapter = lora.is_lora(model)
    state = full_state_dict(model, trainable_only=adapter)
    if dist.is_main():
        with atomic_dir(path) as stage:
            if adapter:
                lora.save_model(model, stage, state_dict=state)
            else:
                model.save_pretrained(stage, state_dict=state)
            tokenizer.save_pretrained(stage)
            if extra:
                torch.save(extra, stage / "trainer_state.pt")
    dist.barrier()
