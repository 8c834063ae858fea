"""The tools known by name wherever a recorded call is read back: what a trajectory records of a call
(`ToolCallRecord.code`, `Tool.recorded_code`) and how the trajectory viewer shows it (`Tool.show`).

A task's `ToolSet` runs its tools; a record names its tool, and this registry answers for that name. A tool's module
registers it once, when imported (the code interpreter in `tirl/tools/code_interpreter.py`; your own tool in your
module):

register_tool(CodeInterpreter())

A name nobody registered records no code and is shown `name(arguments as JSON)`.
"""

from __future__ import annotations

from typing import Any

from tirl.tools.base import Tool, call_text

_TOOLS: dict[str, Tool] = {}


def register_tool(tool: Tool, *, replace: bool = False) -> Tool:
    """Register `tool` under its name and return it; a name already taken by another tool raises unless
    `replace=True`."""
    if not isinstance(tool, Tool):
        raise TypeError(
            f"{tool!r} is not a tool: register a Tool (a subclass, or a @tool(sandbox=False) function)"
        )
    taken = _TOOLS.get(tool.name)
    if taken is not None and taken is not tool and not replace:
        raise ValueError(
            f"a tool named {tool.name!r} is already registered ({type(taken).__name__}); pass replace=True to "
            "replace it"
        )
    _TOOLS[tool.name] = tool
    return tool


def registered_tool(name: str | None) -> Tool | None:
    """The tool registered under `name`; None for a name nobody registered (or a call too malformed to name)."""
    return _TOOLS.get(name) if name is not None else None


def recorded_code(name: str | None, arguments: dict[str, Any] | None) -> str | None:
    """What a trajectory records as a call's code (`ToolCallRecord.code`): its registered tool's
    `recorded_code`; None for any other call."""
    tool = registered_tool(name)
    return tool.recorded_code(arguments) if tool is not None else None


def show_call(name: str | None, arguments: dict[str, Any] | None) -> str | None:
    """How the trajectory viewer shows a recorded call: a registered tool its own way (`Tool.show`; the code
    interpreter its code), any other named tool `name(arguments as JSON)`; None for a call too malformed to name."""
    if name is None:
        return None
    tool = registered_tool(name)
    return tool.show(arguments) if tool is not None else call_text(name, arguments)
