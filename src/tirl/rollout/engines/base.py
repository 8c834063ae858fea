"""The engine seam: what every rollout engine declares, and the defaults of an engine without a model in this process.

Callers (the agent loops, the RL trainer, the episode driver) use an engine only through `Engine`: nothing outside
an engine's own package asks it for an attribute the protocol does not name.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

import torch

if TYPE_CHECKING:
    from tirl.rollout.capabilities import EngineCapabilities
    from tirl.rollout.sampling import SamplingParams
    from tirl.rollout.types import Generation


class Engine(Protocol):
    """The rollout engine seam: token ids in; sampled ids, their log-probs and a finish reason out.

    Log-probs are those of the sampled token under the temperature-scaled distribution (what the trainer
    recomputes). `max_new_tokens` may differ per prompt (budgets); `seeds`, one per prompt, make a request's
    sampling reproducible on engines that take a seed per request, and the others take a `generator` on `device`.
    `sync_weights(model)` is called by the RL trainer after every optimizer update: an engine that serves a copy of
    the policy must load the new weights (and drop its prefix cache) before it samples again; the in-process torch
    engine shares the module, so for it only the version changes. `capabilities` says what the engine can do (the
    rules that depend on it live in `tirl.rollout.capabilities`); `check(tokenizer)` fails before any rollout when
    the engine and the tokenizer do not belong together (a server serving another model, a tokenizer with ids the
    model has no embedding for). `awake()` brackets a phase of rollouts (a colocated engine sleeps outside it, a
    paused server is continued, the torch engine keeps its prefix cache for it). `max_positions`: the positions the
    model in this process holds, 0 for a server (which checks its own context length). An engine whose capabilities
    say `sync_gate` also has `gate`, the `tirl.rollout.engines.gate.RequestGate` its requests pass and its sync
    closes (`gate.interrupt` on: partial rollouts, where the capabilities say `partial_rollouts`).
    """

    capabilities: EngineCapabilities
    weight_version: int

    @property
    def device(self) -> torch.device: ...

    @property
    def max_positions(self) -> int: ...

    def check(self, tokenizer: Any) -> None: ...

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        *,
        max_new_tokens: Sequence[int] | int | None = None,
        generator: torch.Generator | None = None,
        seeds: Sequence[int] | None = None,
    ) -> list[Generation]: ...

    def sync_weights(self, model: torch.nn.Module) -> None: ...

    def awake(self) -> contextlib.AbstractContextManager[Any]: ...

    def close(self) -> None: ...


# what `Engine` names besides its methods' signatures: every engine class has each of these
ENGINE_MEMBERS = ("capabilities", "weight_version", "device", "max_positions", "check", "generate", "sync_weights",
                  "awake", "close")  # fmt: skip


class RemoteModel:
    """`Engine`'s members for an engine whose model lives elsewhere (a server, a colocated vLLM engine): generators
    on the CPU, no position limit known here, nothing to do around a phase of rollouts."""

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    @property
    def max_positions(self) -> int:
        return 0

    def awake(self) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()
