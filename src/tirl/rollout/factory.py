"""The one place that turns `rollout.*` into an engine and an agent loop, and answers capability questions by name.

Code outside `tirl.rollout` never names an engine class: it calls `build_agent` (engine, checked, plus the loop
`rollout.mode` resolves to), and `capabilities_for(name)` / `rl_refusal(...)` where it only has the config (`tirl
plan`, the RL stage before it loads a model). The rules themselves live in `tirl.rollout.capabilities`.

Adding an engine: a class implementing `tirl.rollout.types.Engine` (its `capabilities` record, `check`,
`generate`, `sync_weights`, `close`), a builder here that makes it from `RolloutConfig` and `EngineInputs`, one
entry in `_ENGINES`, its name in `tirl.rollout.config.ENGINES` and its own settings in a section of
`RolloutConfig` (`rollout.<name>.*`). Nothing outside this package changes.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tirl.rollout.agent import AgentConfig, AgentLoop, stop_token_ids
from tirl.rollout.async_agent import AsyncAgentLoop
from tirl.rollout.capabilities import EngineCapabilities, capabilities_of
from tirl.rollout.config import ENGINES, RolloutConfig
from tirl.rollout.timeouts import Throughput

if TYPE_CHECKING:
    import torch

    from tirl.chat.template import ChatRenderer
    from tirl.rollout.types import Engine
    from tirl.sandbox.types import Sandbox
    from tirl.tools.base import ToolSet


@dataclass(frozen=True)
class EngineInputs:
    """What an engine is built from besides `rollout.*`: the policy (the torch engine samples from it; vllm serves
    `model_path`, or the policy written out when that is no plain Hugging Face directory), its tokenizer, the ids that
    end a turn, and where a server engine's log and synced weights go (`work_dir`/vllm; temporary without one)."""

    model: torch.nn.Module
    tokenizer: Any
    eos_id: int
    pad_id: int
    stop_ids: tuple[int, ...] = ()
    dtype: str = "float32"  # model.dtype: a server engine computes in it unless rollout.dtype says otherwise
    # model.autocast resolved: the torch engine's precision on rollout.dtype auto
    autocast: torch.dtype | None = None
    model_path: str = ""
    work_dir: Path | None = None


def _torch(ro: RolloutConfig, x: EngineInputs) -> Engine:
    import torch

    from tirl.rollout.engine import TorchEngine

    if ro.dtype not in ("auto", "float32", "bfloat16"):
        raise ValueError(
            f"rollout.dtype={ro.dtype!r} with the torch engine: it decodes in float32 or bfloat16 (or auto)"
        )
    compute = {"auto": x.autocast, "bfloat16": torch.bfloat16, "float32": None}[ro.dtype]
    t = ro.torch
    return TorchEngine(
        x.model, eos_ids=[x.eos_id], pad_id=x.pad_id, stop_ids=x.stop_ids, max_batch_size=t.max_batch_size,
        compute_dtype=compute, keep_prefix_mib=t.keep_prefix_mib, compile=t.compile, pack=t.pack,
        cuda_graphs=t.cuda_graphs, graph_kv_gib=t.graph_kv_gib, compile_graph_step=t.compile_graph_step,
    )  # fmt: skip


def _vllm(ro: RolloutConfig, x: EngineInputs) -> Engine:
    """One managed server in one process; under torchrun, or with `rollout.urls`, a pool of servers every rank
    samples from (`tirl.rollout.vllm_pool`)."""
    from tirl.rollout.vllm_engine import VLLMEngine, VLLMEngineConfig
    from tirl.rollout.vllm_pool import build_pool, world_size
    from tirl.rollout.vllm_weights import is_plain_hf_dir, servable_dir

    v = ro.vllm
    if v.placement == "colocated":
        from tirl.rollout.vllm_colocated import ColocatedEngine, VLLMBackend, check_placement, engine_kwargs

        check_placement(v.placement)
        kw = engine_kwargs(v.args, v.kv_cache_gib)
        backend = VLLMBackend(
            x.model_path, dtype=ro.served_dtype(x.dtype), stop_ids=[x.eos_id, *x.stop_ids], extra=kw
        )
        return ColocatedEngine(backend, eos_ids=[x.eos_id], stop_ids=x.stop_ids)
    wd = x.work_dir / "vllm" if x.work_dir else None
    pooled = bool(ro.urls) or world_size() > 1
    if pooled and not is_plain_hf_dir(x.model_path):  # a sharded policy cannot be exported by one rank alone
        raise ValueError(
            f"rollout.engine=vllm under torchrun or with rollout.urls serves model.path as it is, and "
            f"{x.model_path or 'the model'} is no plain Hugging Face directory (config.json, *.safetensors, "
            "tokenizer): export it first with tirl export"
        )
    vcfg = VLLMEngineConfig(
        model=str(servable_dir(x.model_path, x.model, x.tokenizer, wd)), python=v.python, port=v.port,
        kv_cache_gib=v.kv_cache_gib, dtype=ro.served_dtype(x.dtype), extra_args=list(v.args),
        startup_timeout_s=v.startup_timeout_s, work_dir=str(wd or ""), eos_ids=[x.eos_id],
        stop_ids=list(x.stop_ids), concurrency=ro.concurrency, request_timeout_s=ro.request_timeout_s,
        min_tokens_per_s=ro.min_tokens_per_s, retries=ro.retries, sync=v.sync, sync_host=v.sync_host,
        pause_idle=v.pause_idle,
    )  # fmt: skip
    return build_pool(vcfg, list(ro.urls), ro.model_name) if pooled else VLLMEngine(vcfg)


def _openai(ro: RolloutConfig, x: EngineInputs) -> Engine:
    from tirl.rollout.openai_engine import OpenAIEngine, OpenAIEngineConfig

    return OpenAIEngine(
        OpenAIEngineConfig(
            urls=list(ro.urls), model=ro.model_name, concurrency=ro.concurrency, timeout_s=ro.request_timeout_s,
            min_tokens_per_s=ro.min_tokens_per_s, retries=ro.retries, eos_ids=[x.eos_id], stop_ids=list(x.stop_ids),
        )
    )  # fmt: skip


# rollout.engine (one of tirl.rollout.config.ENGINES) -> the engine class ("module:Class", imported when first
# asked about) and its builder
_ENGINES: dict[str, tuple[str, Callable[[RolloutConfig, EngineInputs], Engine]]] = {
    "torch": ("tirl.rollout.engine:TorchEngine", _torch),
    "vllm": ("tirl.rollout.vllm_engine:VLLMEngine", _vllm),
    "openai": ("tirl.rollout.openai_engine:OpenAIEngine", _openai),
}


def engine_class(name: str) -> type:
    """The class `rollout.engine=name` builds; an unknown name raises and lists the valid ones."""
    if name not in _ENGINES:
        raise ValueError(f"unknown rollout.engine {name!r}; valid: {', '.join(ENGINES)}")
    module, cls = _ENGINES[name][0].split(":")
    return getattr(importlib.import_module(module), cls)


def capabilities_for(name: str) -> EngineCapabilities:
    """The capabilities of the engine `rollout.engine=name` builds, without building it."""
    return capabilities_of(engine_class(name))


def rl_refusal(caps: EngineCapabilities, world: int) -> str | None:
    """Why RL cannot sample with this engine on `world` processes, naming the engines that can; None when it can."""
    why = caps.why_not_rl(world)
    if why is None:
        return None
    fit = " or ".join(n for n in ENGINES if capabilities_for(n).why_not_rl(world) is None)
    return f"{why}; use rollout.engine={fit} for tirl rl" + (" on several processes" if world > 1 else "")


def check_placement(ro: RolloutConfig) -> None:
    """`rollout.vllm.placement` this machine cannot run, refused before anything is loaded."""
    from tirl.rollout.vllm_colocated import check_placement as check

    check(ro.vllm.placement)


def awake(engine: Engine) -> contextlib.AbstractContextManager:
    """The engine awake for the rollouts inside: a colocated engine sleeps outside them; nothing for the others."""
    hook = getattr(engine, "awake", None)
    return hook() if hook is not None else contextlib.nullcontext()


def build_engine(ro: RolloutConfig, inputs: EngineInputs) -> Engine:
    """The engine `rollout.engine` names, checked against the tokenizer before any rollout (closed if that fails)."""
    engine_class(ro.engine)  # an unknown name fails here, listing the valid ones
    engine = _ENGINES[ro.engine][1](ro, inputs)
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
    """The loop `rollout.mode` resolves to for this engine (`EngineCapabilities.rollout_loop`)."""
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
