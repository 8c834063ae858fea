"""The Hermes tool-call format of the reference recipe (`chat.tool_format: hermes`, the default).

The model writes `<tool_call>\n{"name": "code_interpreter", "arguments": {"code": "..."}}\n</tool_call>`, one or
more per turn, and the system turn lists the schemas in Qwen2.5/Qwen3's "# Tools" block. The recipe drops a
malformed call instead of answering it, and a turn with no valid call left ends the trajectory:
`agent.malformed_calls=drop` (rollout/agent/loop.py) does that.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from tirl.chat.tool_formats.base import (
    JSON_ERRORS,
    TOOL_CALL_END,
    TOOL_CALL_START,
    Schemas,
    ToolCall,
    ToolFormat,
    json_error,
)


def parse_body(raw: str, schemas: Schemas = ()) -> ToolCall:
    """One call's JSON body; the schemas are not needed (JSON carries its own types)."""
    try:
        obj = json.loads(raw)
    except JSON_ERRORS as e:
        return ToolCall(raw=raw, error=f"Error: the tool call is not valid JSON ({json_error(e)}).")
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return ToolCall(
            raw=raw, error="Error: the tool call must be a JSON object with 'name' and 'arguments'."
        )
    name = obj["name"]
    args = obj.get("arguments", {})
    if isinstance(args, str):  # some models send the arguments as a JSON string
        try:
            args = json.loads(args)
        except JSON_ERRORS:
            pass  # not a JSON object either way: the error below
    if not isinstance(args, dict):
        return ToolCall(
            raw=raw,
            name=name,
            error=f"Error: the arguments of {name!r} must be a JSON object of named values.",
        )
    return ToolCall(raw=raw, name=name, arguments=args)


def call_json(name: str, arguments: Mapping[str, Any]) -> str:
    """The JSON body of a call, laid out as Qwen's template writes it (`{"name": ..., "arguments": {...}}`)."""
    return json.dumps({"name": name, "arguments": dict(arguments)}, ensure_ascii=False)


def render(name: str, arguments: Mapping[str, Any]) -> str:
    return f"{TOOL_CALL_START}\n{call_json(name, arguments)}\n{TOOL_CALL_END}"


def tools_block(tools: Schemas) -> str:
    """Qwen's "# Tools" system text; schemas serialized like the Jinja `tojson` filter (json.dumps defaults)."""
    listing = "".join("\n" + json.dumps(t, ensure_ascii=False) for t in tools)
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
        + listing
        + "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
        '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": '
        "<args-json-object>}\n</tool_call>"
    )


FORMAT = ToolFormat("hermes", render=render, parse_body=parse_body, tools_block=tools_block)


def parse_tool_calls(text: str, limit: int | None = None) -> list[ToolCall]:
    """Every Hermes call of an assistant turn in order, at most `limit` (`ToolFormat.parse`)."""
    return FORMAT.parse(text, limit=limit)
