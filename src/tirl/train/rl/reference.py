"""The KL reference policy: the model the policy is kept close to when `rl.kl.coef > 0`.

For a LoRA policy it is the policy's own frozen base, run with the adapter disabled (peft's `disable_adapter`):
no second copy of the weights, and by construction exactly the model training started from. For full fine-tuning
it is a frozen copy of the initial policy, in `model.ref_dtype` (bfloat16 halves its memory; its log-probs then
differ slightly from the policy's own at step 0, so the KL starts a little above zero). Under torchrun that copy
is made before the policy is sharded (`copy_before_sharding`), as a sharded module cannot be deep-copied.
"""

from __future__ import annotations

import contextlib
import copy as _copy
from collections.abc import Iterator

import torch

from tirl.models.lora import is_lora
from tirl.train import dist, fsdp


class Reference:
    def __init__(
        self,
        policy: torch.nn.Module,
        dtype: torch.dtype | None = None,
        *,
        copy: torch.nn.Module | None = None,
    ) -> None:
        """`copy`: the frozen copy, made by the caller (already in `dtype`) when `policy` cannot be deep-copied
        (FSDP-sharded)."""
        self._policy = policy
        self._copy: torch.nn.Module | None = None
        if copy is not None and not is_lora(policy):
            self._copy = copy.eval().requires_grad_(False)
        elif not is_lora(policy):
            self._copy = _copy.deepcopy(policy).eval().requires_grad_(False)
            if dtype is not None:
                self._copy.to(dtype)

    @property
    def shares_weights(self) -> bool:
        """True when the reference is the policy's base (LoRA), False for a separate copy."""
        return self._copy is None

    @contextlib.contextmanager
    def model(self) -> Iterator[torch.nn.Module]:
        """The reference model for the duration of the block (for LoRA: the policy, its adapter switched off)."""
        if self._copy is not None:
            yield self._copy
            return
        with self._policy.disable_adapter():
            yield self._policy


def copy_before_sharding(
    policy: torch.nn.Module, dtype: torch.dtype | None, *, reshard_after_forward: bool = True
) -> torch.nn.Module | None:
    """Under torchrun, the full-training reference's frozen copy of the still unsharded `policy`, in `dtype` and
    sharded, for `Reference(copy=...)`; None in one process (`Reference` copies the policy itself) and for LoRA
    (the reference is the policy's base)."""
    if not dist.is_distributed() or is_lora(policy):
        return None
    ref = _copy.deepcopy(policy)
    if dtype is not None:
        ref.to(dtype)
    return fsdp.shard(ref, reshard_after_forward=reshard_after_forward)
