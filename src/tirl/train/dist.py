"""The distribution seam's smallest part: rank, world size and sums across processes, correct in one process too.

Trainers normalize losses and metrics by counts summed over every process that shares a mini-batch; with no
process group these functions are the identity, so single-process code calls them unconditionally.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    return dist.get_rank() if is_distributed() else 0


def world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def is_main() -> bool:
    """Rank 0 logs and writes; every other rank stays quiet."""
    return rank() == 0


def all_reduce_sum(x: torch.Tensor) -> torch.Tensor:
    """Sum of `x` over all processes (a new tensor; `x` itself is left as it was)."""
    if not is_distributed():
        return x.clone()
    out = x.detach().clone()
    dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out
