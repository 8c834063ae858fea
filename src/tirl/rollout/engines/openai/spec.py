"""The openai engine's spec (`tirl.rollout.engines.spec`): servers someone else runs, sampled over HTTP."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tirl.rollout.engines.spec import EngineMemory, EngineSpec, MemoryQuery

if TYPE_CHECKING:
    from tirl.rollout.config import RolloutConfig
    from tirl.rollout.engines.base import Engine
    from tirl.rollout.engines.spec import EngineInputs


def build(ro: RolloutConfig, x: EngineInputs) -> Engine:
    from tirl.rollout.engines.openai.engine import OpenAIEngine, OpenAIEngineConfig

    return OpenAIEngine(
        OpenAIEngineConfig(
            urls=list(ro.urls), model=ro.model_name, concurrency=ro.concurrency, timeout_s=ro.request_timeout_s,
            min_tokens_per_s=ro.min_tokens_per_s, retries=ro.retries, eos_ids=[x.eos_id], stop_ids=list(x.stop_ids),
        )
    )  # fmt: skip


def memory(q: MemoryQuery) -> EngineMemory:
    """Nothing on the trainer's GPUs: the servers are someone else's."""
    return EngineMemory(0.0, f"servers of their own ({', '.join(q.rollout.urls)}), not counted here", True)


SPEC = EngineSpec("openai", "tirl.rollout.engines.openai.engine:OpenAIEngine", build, memory)
