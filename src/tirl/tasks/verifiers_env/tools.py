"""A verifiers environment's tools as tirl function tools: each `@vf.tool` method of its `vf.Toolset`s.

verifiers serves a toolset as an MCP server, by default in a subprocess on the machine that runs the rollout
(`ToolsetConfig.runtime`: `subprocess`, outside any sandbox), and the model calls each tool as
`<server>_<tool>` (the server's `TOOL_PREFIX`, else its snake-cased class name; a `None` prefix leaves the name
bare). tirl calls the same methods in its own process, under the same names and with schemas from their type
hints and docstrings: `FunctionTool`s, `sandbox=False`. tirl cannot read a method to tell whether it executes
its arguments; it goes by where the author put the toolset: one left on the local subprocess runtime already
runs the model's arguments on this machine, unsandboxed, under verifiers, and one given a container or remote
runtime (what a tool that executes model code needs) is refused. Such a tool is not supported: the model runs
code in tirl through the sandboxed `code_interpreter`. Each toolset's `setup` runs once, and its calls run on
its own event loop (`loop.py`), one at a time, as in the one server process verifiers starts.

Refused, naming the toolset: a runtime other than `subprocess` (docker, prime, ...: isolation tirl's function
tools do not give), `colocated` (it runs in the agent's box), `url` (a remote server), a `State` subclass (state
synced with the rollout over verifiers' channel), a per-task `setup_task` (tirl's tools serve every row alike),
and a server that is not a `vf.Toolset`. The harness's own tools (the `bash` harness's shell) are not added:
tirl's agent loop is the harness, and its sandboxed `code_interpreter` is not listed unless the environment
has it.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

from tirl.tasks.verifiers_env.load import LoadedEnv
from tirl.tasks.verifiers_env.loop import EnvLoop
from tirl.tools.base import FunctionTool

TOOL_TIMEOUT_S = 30.0  # one call; a late one answers a timeout error to the model


def _refusal(env: LoadedEnv, server: Any) -> str | None:
    """Why tirl cannot call `server`'s tools in its process, or None."""
    from verifiers.v1.mcp.server import ServerBase
    from verifiers.v1.state import State, state_cls

    vf, cfg = env.vf, getattr(server, "config", None)
    runtime = getattr(cfg, "runtime", None)
    if not isinstance(server, vf.Toolset):
        return "it is not a vf.Toolset (only @vf.tool methods are supported)"
    if getattr(cfg, "url", None):
        return f"it is a remote server ({cfg.url})"
    if getattr(cfg, "colocated", False):
        return "it is colocated in the agent's box"
    if runtime is not None and getattr(runtime, "type", None) != "subprocess":
        kind = getattr(runtime, "type", type(runtime).__name__)
        return f"it asks for the {kind} runtime, isolation tirl's function tools do not give"
    if state_cls(type(server)) is not State:
        return "it keeps rollout state (a vf.State subclass) synced over verifiers' channel"
    if type(server).setup_task is not ServerBase.setup_task:
        return "it sets itself up per task (setup_task), and tirl's tools serve every row alike"
    return None


def _caller(method: Any, loop: EnvLoop) -> Any:
    """`method` as a plain function of keyword arguments, run on the toolset's loop (awaited if async), with the
    method's signature and docstring for its schema."""

    async def call(kwargs: dict[str, Any]) -> Any:
        result = method(**kwargs)
        return await result if inspect.isawaitable(result) else result

    @functools.wraps(method)
    def run(**kwargs: Any) -> Any:
        return loop.run(call(kwargs), TOOL_TIMEOUT_S)

    return run


def env_tools(env: LoadedEnv, task: Any) -> list[FunctionTool]:
    """The tools of the taskset's shared toolsets and of its task's, in that order."""
    servers = [*type(env.taskset).toolsets(env.taskset.config), *type(task).toolsets(task.config)]
    refused = [f"{type(s).__name__}: {why}" for s in servers if (why := _refusal(env, s))]
    if refused:
        raise ValueError(f"task {env.spec!r}: tirl cannot call these toolsets' tools: " + "; ".join(refused))
    from verifiers.v1.utils.decorators import discover_decorated

    tools = []
    for server in servers:
        loop = EnvLoop(f"tirl-verifiers-{server.server_name or type(server).__name__}")
        loop.run(server.setup())
        for method in discover_decorated(server, "tool"):
            name = getattr(method, "tool_name", None) or method.__name__
            full = f"{server.server_name}_{name}" if server.server_name else name
            try:
                tools.append(FunctionTool(_caller(method, loop), name=full, timeout_s=TOOL_TIMEOUT_S))
            except (TypeError, ValueError) as e:
                raise ValueError(
                    f"task {env.spec!r}: tool {full!r} of {type(server).__name__}: {e}"
                ) from None
    return tools
