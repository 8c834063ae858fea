"""Processes that share one training run: start-up from torchrun's environment, rank, world size, reductions.

Trainers normalize losses and metrics by counts summed over every process that shares a mini-batch; with no
process group every function here is the identity (or its one-process equivalent), so single-process code calls
them unconditionally and stays bit-identical to a run without torchrun.

`init_distributed` reads torchrun's variables (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR/PORT`): the world
size is never a config value. gloo serves CPU runs (tested on this machine), nccl CUDA runs (not testable here).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from tirl.train.config import DistConfig

T = TypeVar("T")


def env_world_size() -> int:
    """The world size torchrun announced (1 without torchrun)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def resolve_backend(backend: str, device: str) -> str:
    """`auto` -> nccl for a CUDA device, gloo otherwise; a mismatch is a start-up error naming `dist.backend`."""
    cuda = device.startswith("cuda")
    if backend == "auto":
        return "nccl" if cuda else "gloo"
    if backend == "nccl" and not cuda:
        raise ValueError(
            f"dist.backend=nccl needs model.device=cuda, got model.device={device!r} (use gloo on CPU)"
        )
    return backend


def init_distributed(cfg: DistConfig, device: str) -> bool:
    """Join the process group torchrun set up; returns False (and does nothing) when there is one process.

    On CPU, CUDA is hidden from this process (`CUDA_VISIBLE_DEVICES=""` unless set) so that FSDP2 cannot move
    the model to a GPU behind gloo's back (pytorch issue 132471); on CUDA, each process takes GPU `LOCAL_RANK`.
    Every rank but 0 is silenced (console, progress bars): rank 0 logs and writes.
    """
    if env_world_size() <= 1 or is_distributed():
        return is_distributed()
    backend = resolve_backend(cfg.backend, device)
    if backend == "nccl":
        if not torch.cuda.is_available():
            raise ValueError("dist.backend=nccl but CUDA is not available in this process")
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    else:
        os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    dist.init_process_group(backend=backend, timeout=timedelta(seconds=cfg.timeout_s))
    if rank() != 0:
        from tirl.core.logging import console

        os.environ["TIRL_QUIET"] = "1"
        console.quiet = True
    return True


# what gloo and NCCL say when the other end of a collective is gone (its process died, its machine vanished)
PEER_LOST = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "Timed out", "timed out",
             "NCCL communicator was aborted", "Socket Timeout")  # fmt: skip


def lost_peer(e: BaseException) -> str | None:
    """The first line of `e` when it is a collective that failed because another rank is gone, else None."""
    if not is_distributed():
        return None
    text = str(e).strip()
    first = text.splitlines()[0] if text else type(e).__name__
    if isinstance(e, getattr(dist, "DistError", ())) or (
        isinstance(e, RuntimeError) and any(p in text for p in PEER_LOST)
    ):
        return first
    return None


def shutdown() -> None:
    if is_distributed():
        dist.destroy_process_group()


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    return dist.get_rank() if is_distributed() else 0


def world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def is_main() -> bool:
    """Rank 0 logs and writes; every other rank stays quiet."""
    return rank() == 0


def rank_share(items: Sequence[T]) -> list[T]:
    """This rank's share of `items`, the one way work is split over ranks: every world-th item from this rank's
    index on (shares differ by one item at most; all of `items` in one process)."""
    return list(items[rank() :: world_size()])


def rank_seed(seed: int) -> int:
    """This rank's seed for its own generators (sampling, mini-batch order): `seed` itself on rank 0, so a
    single-process run draws exactly what it drew before torchrun existed."""
    return seed + 1_000_003 * rank()


def all_reduce_sum(x: torch.Tensor) -> torch.Tensor:
    """Sum of `x` over all processes (a new tensor; `x` itself is left as it was)."""
    if not is_distributed():
        return x.clone()
    out = x.detach().clone()
    dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out


def all_reduce_max(value: int) -> int:
    """The largest of every process's `value`."""
    if not is_distributed():
        return value
    t = torch.tensor([value], dtype=torch.long, device=_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def any_rank(flag: bool) -> bool:
    """True on every process when `flag` is true on any (a stop signal seen by one rank stops them all at the
    same step: the checkpoint that follows is collective)."""
    return all_reduce_max(int(flag)) > 0


def sum_floats(values: dict[str, float]) -> dict[str, float]:
    """Each entry summed over all processes; a key some process lacks counts as 0 there (a rank whose
    micro-batches were all empty has no loss statistics)."""
    if not is_distributed():
        return dict(values)
    keys = sorted(set().union(*all_gather_objects(sorted(values))))
    if not keys:
        return {}
    t = torch.tensor([values.get(k, 0.0) for k in keys], dtype=torch.float64, device=_device())
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return dict(zip(keys, t.tolist(), strict=True))


def all_gather_objects(obj: Any) -> list[Any]:
    """Every process's `obj` (picklable), in rank order; [obj] in one process."""
    if not is_distributed():
        return [obj]
    out: list[Any] = [None] * world_size()
    dist.all_gather_object(out, obj)
    return out


def broadcast_object(obj: Any) -> Any:
    """Rank 0's `obj` on every process."""
    if not is_distributed():
        return obj
    box = [obj if is_main() else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def barrier() -> None:
    if is_distributed():
        dist.barrier()


def _device() -> torch.device:
    """Where collectives of small tensors live: the current GPU under nccl, the CPU under gloo."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
