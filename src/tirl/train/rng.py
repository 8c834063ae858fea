"""Every global random generator a trainer draws from, captured into a checkpoint and put back from one.

A resumed run continues bit for bit only if Python's, NumPy's, torch's CPU and (where present) CUDA generators are
where the interrupted run left them: `tirl.train.checkpoint_write` stores `rng_state()` with every checkpoint (one
per rank when sharded) and `tirl.train.checkpoint.restore_trainer` calls `set_rng_state` last, once nothing else
will draw from them before the next step. Not here: the trainers' own generators (their `state_dict`) and the
per-rank seeds (`tirl.train.dist`).
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def rng_state() -> dict[str, Any]:
    """Every global generator the trainers draw from: Python, NumPy, torch CPU and (if present) CUDA."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
