"""The KL reference policy: the model the policy is kept close to when `rl.kl_coef > 0`.

For a LoRA policy it is the policy's own frozen base, run with the adapter disabled (peft's `disable_adapter`):
no second copy of the weights, and by construction exactly the model training started from. For full fine-tuning
it is a frozen copy of the initial policy, in `model.ref_dtype` (bfloat16 halves its memory; its log-probs then
differ slightly from the policy's own at step 0, so the KL starts a little above zero).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator

import torch

from tirl.models.lora import is_lora


class Reference:
    def __init__(self, policy: torch.nn.Module, dtype: torch.dtype | None = None) -> None:
        self._policy = policy
        self._copy: torch.nn.Module | None = None
        if not is_lora(policy):
            self._copy = copy.deepcopy(policy).eval().requires_grad_(False)
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
