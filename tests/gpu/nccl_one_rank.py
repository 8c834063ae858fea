"""`tirl` in a process group made before it starts: under `torchrun --nproc_per_node=1` tirl itself makes no group
(one process runs unsharded, `tirl.train.dist.init_distributed`), so this joins one first, with `--backend`
(nccl on a GPU, gloo to check this script on a CPU), and tirl then runs as any rank of a sharded run does: FSDP2
over a one-rank mesh, collectives through the backend, sharded (DCP) checkpoints.

    torchrun --standalone --nproc_per_node=1 tests/gpu/nccl_one_rank.py --backend nccl rl model.device=cuda ...
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as tdist


def main(argv: list[str]) -> int:
    backend = "nccl"
    if argv[:1] == ["--backend"]:
        backend, argv = argv[1], argv[2:]
    if backend == "nccl":
        if not (torch.cuda.is_available() and tdist.is_nccl_available()):
            raise SystemExit("nccl_one_rank.py --backend nccl: needs CUDA and a PyTorch built with NCCL")
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    tdist.init_process_group(backend=backend)
    print(f"process group: {tdist.get_backend()}, world size {tdist.get_world_size()}", flush=True)
    from tirl.cli import main as tirl_main

    return tirl_main(argv)  # tirl's own shutdown destroys the group


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
