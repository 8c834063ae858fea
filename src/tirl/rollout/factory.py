"""The one place that turns `rollout.*` into an engine and an agent loop, and answers questions about an engine by
its name.

Code outside `tirl.rollout` never names an engine class: it calls `build_agent` (engine, checked, plus the loop
`rollout.mode` resolves to), and `capabilities_for(name)`, `engine_spec(name)` (its memory model for `tirl plan`)
or `preflight(rollout)` where it only has the config. The RL rules on capabilities live in `tirl.rollout.capabilities`.

Adding an engine: a package `tirl.rollout.engines.<name>` with its class (implementing
`tirl.rollout.engines.base.Engine`, with its `capabilities` record), `spec.py`, whose `SPEC` builds it, sizes it
and checks it (`tirl.rollout.engines.spec`), and, if it has keys of its own, `config.py` with their section
(`rollout.<name>.*`); `tirl.rollout.engines.registry` finds the package, so nothing outside it changes.
"""

from __future__ import annotations

import contextlib
import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tirl.rollout.agent.async_loop import AsyncAgentLoop
from tirl.rollout.agent.loop import AgentConfig, AgentLoop, stop_token_ids
from tirl.rollout.capabilities import EngineCapabilities, capabilities_of
from tirl.rollout.config import RolloutConfig
from tirl.rollout.engines.registry import ENGINES
from tirl.rollout.engines.spec import EngineInputs, EngineSpec
from tirl.rollout.timeouts import Throughput

if TYPE_CHECKING:
    import torch

    from tirl.chat.template import ChatRenderer
    from tirl.rollout.engines.base import Engine
    from tirl.sandbox.types import Sandbox
    from tirl.tools.base import ToolSet


# rollout.engine (one of tirl.rollout.engines.registry.ENGINES) -> the module holding that engine's SPEC
_ENGINES = {name: f"tirl.rollout.engines.{name}.spec" for name in ENGINES}


def engine_spec(name: str) -> EngineSpec:
    """The spec of the engine `rollout.engine=name` builds; an unknown name raises and lists the valid ones."""
    if name not in _ENGINES:
        raise ValueError(f"unknown rollout.engine {name!r}; valid: {', '.join(ENGINES)}")
    return importlib.import_module(_ENGINES[name]).SPEC


def engine_class(name: str) -> type:
    """The class `rollout.engine=name` builds; an unknown name raises and lists the valid ones."""
    module, cls = engine_spec(name).engine.split(":")
    return getattr(importlib.import_module(module), cls)


def capabilities_for(name: str) -> EngineCapabilities:
    """The capabilities of the engine `rollout.engine=name` builds, without building it."""
    return capabilities_of(engine_class(name))


def preflight(ro: RolloutConfig) -> None:
    """Settings of `rollout.*` this machine cannot run (the engine's own checks), refused before anything loads."""
    engine_spec(ro.engine).preflight(ro)


def awake(engine: Engine) -> contextlib.AbstractContextManager:
    """The engine awake for the rollouts inside: a colocated engine sleeps outside them; nothing for the others."""
    return engine.awake()


def build_engine(ro: RolloutConfig, inputs: EngineInputs) -> Engine:
    """The engine `rollout.engine` names, checked against the tokenizer before any rollout (closed if that fails)."""
    engine = engine_spec(ro.engine).build(ro, inputs)
    try:
        engine.check(inputs.tokenizer)
    except BaseException:
        engine.close()
        raise
    return engine


def agent_loop(
    ro: RolloutConfig,
    engine: Engine,
    renderer: ChatRenderer,
    sandbox: Sandbox,
    config: AgentConfig,
    tools: ToolSet | None = None,
) -> AgentLoop:
    """The loop `rollout.mode` resolves to for this engine (`EngineCapabilities.rollout_loop`), or the user's agent
    program behind the policy endpoint when `agent.program.command` is set."""
    if config.program.command:
        from tirl.rollout.gateway.program import ProgramLoop

        return ProgramLoop(engine, renderer, sandbox, config, config.program, tools=tools)
    if capabilities_of(engine).rollout_loop(ro.mode) == "async":
        # the watchdog grows with the response budget (tirl.rollout.timeouts)
        timeout = Throughput(ro.min_tokens_per_s).limit(ro.timeout_s, config.max_response_tokens)
        return AsyncAgentLoop(
            engine, renderer, sandbox, config, tools=tools, concurrency=ro.concurrency, timeout_s=timeout
        )
    return AgentLoop(engine, renderer, sandbox, config, tools=tools)


def build_agent(
    ro: RolloutConfig,
    config: AgentConfig,
    *,
    model: torch.nn.Module,
    tokenizer: Any,
    renderer: ChatRenderer,
    sandbox: Sandbox,
    tools: ToolSet | None = None,
    dtype: str = "float32",
    autocast: torch.dtype | None = None,
    model_path: str | Path = "",
    work_dir: str | Path | None = None,
) -> AgentLoop:
    """Engine and agent loop from the config; the caller closes `agent.engine` (a server engine's process).
    `dtype`, `autocast`: model.dtype and model.autocast resolved (what rollout.dtype auto follows)."""
    inputs = EngineInputs(
        model, tokenizer, renderer.eos_id, renderer.pad_id, tuple(stop_token_ids(renderer, config)), dtype,
        autocast, str(model_path), Path(work_dir) if work_dir else None,
    )  # fmt: skip
    engine = build_engine(ro, inputs)
    try:
        return agent_loop(ro, engine, renderer, sandbox, config, tools)
    except BaseException:
        engine.close()
        raise
