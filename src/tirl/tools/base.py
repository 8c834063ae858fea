"""Tools the model can call: a Python function with type hints and a docstring, or the sandboxed code interpreter.

Every tool says where it runs. `code_interpreter` runs the model's code in the sandbox, all calls of a rollout step
in one sandbox batch. A function tool runs in tirl's own process on arguments the model wrote, so it is declared
with `@tool(sandbox=False)`: that is the promise that it never executes them (a calculator that parses with `ast`,
a lookup in a table); a function that must run model input as code belongs in the sandbox, via `code_interpreter`.
Function tools run in threads, concurrently with each other and with the sandbox batch unless `concurrent=False`,
each within `timeout_s` (a late call answers a timeout error; its thread is abandoned, not killed).

`ToolSet` is a task's tools: the schemas the chat format lists, the check of a call (unknown tool, wrong argument
names or types: an error text naming the problem, sent back instead of running anything), and the execution of
one step's calls.
"""

from __future__ import annotations

import concurrent.futures
import json
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from tirl.chat.tool_formats import ToolCall
from tirl.sandbox.types import Sandbox
from tirl.tools.schema import check_arguments, function_schema


@dataclass(frozen=True)
class ToolOutput:
    """What one call gave back: the text the model sees, a status ("ok", "tool_error", "timeout", sandbox statuses,
    or "parse_error" for a call that never ran) and the sandbox's raw result where there is one."""

    text: str
    status: str
    exec_result: dict[str, Any] | None = None


class ToolOptions(Protocol):
    """The run's settings a tool may take (the `agent.*` section, `tirl.rollout.agent.config.AgentConfig`)."""

    auto_print: bool


def call_text(name: str, arguments: dict[str, Any] | None) -> str:
    """A call as the trajectory viewer shows it by default: `name({"arg": value, ...})`."""
    return f"{name}({json.dumps(arguments or {}, ensure_ascii=False)})"


class Tool:
    """A named tool with its function schema. Subclasses implement `run_batch` (and may refine `validate`, take
    the run's settings in `configured`, show a call their own way in `show`, or record code in `recorded_code`).
    The viewer and the trajectory record find a tool by its name once it is registered
    (`tirl.tools.registry.register_tool`)."""

    name: str
    schema: dict[str, Any]
    sandbox: bool  # True: runs in the sandbox; False: runs in tirl's process (never on code the model wrote)
    concurrent: bool = True

    def validate(self, arguments: dict[str, Any]) -> str | None:
        return check_arguments(self.schema, arguments)

    def configured(self, options: ToolOptions) -> Tool:
        """This tool under the run's settings (the agent loop asks once, when it is built); itself by default."""
        return self

    def show(self, arguments: dict[str, Any] | None) -> str | None:
        """How the trajectory viewer shows a call of this tool."""
        return call_text(self.name, arguments)

    def recorded_code(self, arguments: dict[str, Any] | None) -> str | None:
        """The code a trajectory records for a call of this tool (`ToolCallRecord.code`); None: the call runs no
        code (its name and arguments are recorded beside it)."""
        return None

    def run_batch(self, arguments: Sequence[dict[str, Any]], sandbox: Sandbox | None) -> list[ToolOutput]:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({getattr(self, 'name', None)!r})"


_threads = concurrent.futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="tirl-tool")
_groups = concurrent.futures.ThreadPoolExecutor(
    max_workers=4, thread_name_prefix="tirl-toolset"
)  # waits on _threads
_serial = threading.Lock()


def _render(value: Any) -> str:
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return str(value)


class FunctionTool(Tool):
    """A Python function as a tool, run in tirl's process (see the module docstring for what that promises)."""

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        concurrent: bool = True,
        timeout_s: float = 10.0,
    ) -> None:
        self.fn = fn
        self.schema = function_schema(fn, name=name)
        self.name = self.schema["function"]["name"]
        self.sandbox = False
        self.concurrent = concurrent
        self.timeout_s = timeout_s

    def _call(self, args: dict[str, Any]) -> ToolOutput:
        try:
            if self.concurrent:
                return ToolOutput(_render(self.fn(**args)), "ok")
            with _serial:
                return ToolOutput(_render(self.fn(**args)), "ok")
        except Exception as e:  # the tool's own failure is information for the model, not a crash
            return ToolOutput(f"Error: {type(e).__name__}: {e}", "tool_error")

    def run_batch(self, arguments: Sequence[dict[str, Any]], sandbox: Sandbox | None) -> list[ToolOutput]:
        futures = [_threads.submit(self._call, a) for a in arguments]
        out = []
        for f in futures:
            try:
                out.append(f.result(timeout=self.timeout_s))
            except concurrent.futures.TimeoutError:
                out.append(
                    ToolOutput(f"Error: {self.name} took longer than {self.timeout_s:g} s.", "timeout")
                )
        return out

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)


def tool(
    fn: Callable[..., Any] | None = None,
    *,
    sandbox: bool,
    name: str | None = None,
    concurrent: bool = True,
    timeout_s: float = 10.0,
) -> Any:
    """Make a tool of a typed, documented function: `@tool(sandbox=False)`.

    `sandbox` must be given, and only False is accepted for a function: it declares that the function runs in
    tirl's process and never executes the model's arguments as code (for that, use `code_interpreter`).
    """
    if sandbox:
        raise ValueError(
            "a Python function tool runs in tirl's process: declare it with sandbox=False (it must never execute "
            "the model's arguments), or let the model run code through the sandboxed code_interpreter tool"
        )

    def wrap(f: Callable[..., Any]) -> FunctionTool:
        return FunctionTool(f, name=name, concurrent=concurrent, timeout_s=timeout_s)

    return wrap if fn is None else wrap(fn)


def as_tool(obj: Tool | Callable[..., Any]) -> Tool:
    if isinstance(obj, Tool):
        return obj
    raise TypeError(
        f"{obj!r} is not a tool: wrap a function with @tool(sandbox=False) (tirl.tools.tool) or use CodeInterpreter()"
    )


class ToolSet:
    """A task's tools by name: their schemas, the check of a call, and the execution of one step's calls."""

    def __init__(self, tools: Sequence[Tool]) -> None:
        self.tools: dict[str, Tool] = {}
        for t in map(as_tool, tools):
            if t.name in self.tools:
                raise ValueError(f"two tools are named {t.name!r}: {self.tools[t.name]!r} and {t!r}")
            self.tools[t.name] = t

    def configured(self, options: ToolOptions) -> ToolSet:
        """The same tools, each under the run's settings (`Tool.configured`)."""
        return ToolSet([t.configured(options) for t in self.tools.values()])

    @property
    def schemas(self) -> list[dict[str, Any]]:
        return [t.schema for t in self.tools.values()]

    def check(self, call: ToolCall) -> str | None:
        """The error text to send back instead of running `call`, or None if it may run."""
        if call.error is not None:
            return call.error
        if call.name not in self.tools:
            return f"Error: unknown tool {call.name!r}; available: {', '.join(self.tools) or 'none'}."
        return self.tools[call.name].validate(call.arguments or {})

    def execute(
        self,
        calls: Sequence[ToolCall],
        sandbox: Sandbox | None,
        *,
        max_chars: int = 256,
        truncate_side: Literal["middle", "right"] = "middle",
    ) -> list[ToolOutput]:
        """One output per call, in order: invalid calls get their error ("parse_error") without running; each tool
        runs its valid calls as one batch, the tools concurrently with each other."""
        out: list[ToolOutput | None] = [None] * len(calls)
        groups: dict[str, list[int]] = {}
        for k, c in enumerate(calls):
            err = self.check(c)
            if err is not None:
                out[k] = ToolOutput(err, "parse_error")
            else:
                groups.setdefault(str(c.name), []).append(k)
        # function tools start in threads; sandboxed tools run their batch here, meanwhile (the sandbox client is
        # driven from the agent's thread, as before)
        jobs = {
            name: _groups.submit(self.tools[name].run_batch, [calls[k].arguments or {} for k in idx], sandbox)
            for name, idx in groups.items()
            if not self.tools[name].sandbox
        }
        results = {
            name: self.tools[name].run_batch([calls[k].arguments or {} for k in idx], sandbox)
            for name, idx in groups.items()
            if self.tools[name].sandbox
        }
        results.update({name: job.result() for name, job in jobs.items()})
        for name, idx in groups.items():
            for k, o in zip(idx, results[name], strict=True):
                out[k] = ToolOutput(_truncate(o.text, max_chars, truncate_side), o.status, o.exec_result)
        return [o for o in out if o is not None]


def truncate_middle(text: str, max_chars: int = 256, *, marker: str = "...(truncated)...") -> str:
    """Keep the first and last max_chars/2 characters (the recipe's `middle` mode)."""
    if max_chars <= 0 or len(text) <= max_chars:
        return text
    half = max_chars // 2
    return text[:half] + marker + text[len(text) - (max_chars - half) :]


def _truncate(text: str, max_chars: int, side: str) -> str:
    if side == "middle":
        return truncate_middle(text, max_chars)
    return text[:max_chars] + "...(truncated)" if len(text) > max_chars else text
