"""The Hermes tool-call format of the reference recipe: parse a model's calls, write one, truncate a result.

The model writes `<tool_call>{"name": "code_interpreter", "arguments": {"code": "..."}}</tool_call>`, one or more
per turn. `parse_tool_calls` reads the syntax; which names and arguments are valid is the task's tools' business
(`tirl.tools.ToolSet.check`). Anything malformed becomes a `ToolCall` with an `error` text that is fed back to the
model as the tool response: a broken call never crashes a rollout. The recipe instead drops a malformed call, and a
turn with no valid call left ends the trajectory: `agent.malformed_calls=drop` (rollout/agent/loop.py) does that.

Nothing here knows a particular tool: the code interpreter's name, schema, code preparation and output formatting
are `tirl.tools.code_interpreter`'s (tools/ lies above chat/).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"

_CALL_RE = re.compile(re.escape(TOOL_CALL_START) + r"(.*?)" + re.escape(TOOL_CALL_END), re.DOTALL)


@dataclass(frozen=True)
class ToolCall:
    """A parsed call: the tool `name` and its `arguments`, or `error` to send back instead of running anything."""

    raw: str
    name: str | None = None
    error: str | None = None
    arguments: dict[str, Any] | None = None


def _parse_body(raw: str) -> ToolCall:
    try:
        obj = json.loads(raw)
    except json.JSONDecodeError as e:
        return ToolCall(raw=raw, error=f"Error: the tool call is not valid JSON ({e.msg} at char {e.pos}).")
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return ToolCall(
            raw=raw, error="Error: the tool call must be a JSON object with 'name' and 'arguments'."
        )
    name = obj["name"]
    args = obj.get("arguments", {})
    if isinstance(args, str):  # some models send the arguments as a JSON string
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            pass
    if not isinstance(args, dict):
        return ToolCall(
            raw=raw,
            name=name,
            error=f"Error: the arguments of {name!r} must be a JSON object of named values.",
        )
    return ToolCall(raw=raw, name=name, arguments=args)


def parse_tool_calls(text: str, limit: int | None = None) -> list[ToolCall]:
    """Every call of an assistant turn in order, at most `limit` (empty: the turn is the final answer).

    An opening `<tool_call>` without its closing tag after the last closed call counts as a malformed call.
    """
    calls = []
    end = 0
    for m in _CALL_RE.finditer(text):
        calls.append(_parse_body(m.group(1).strip()))
        end = m.end()
    if TOOL_CALL_START in text[end:]:
        raw = text[text.index(TOOL_CALL_START, end) :]
        calls.append(ToolCall(raw=raw, error=f"Error: the tool call is not closed with {TOOL_CALL_END}."))
    return calls[:limit] if limit is not None else calls


def truncate_middle(text: str, max_chars: int = 256, *, marker: str = "...(truncated)...") -> str:
    """Keep the first and last max_chars/2 characters (the recipe's `middle` mode)."""
    if max_chars <= 0 or len(text) <= max_chars:
        return text
    half = max_chars // 2
    return text[:half] + marker + text[len(text) - (max_chars - half) :]


def call_json(name: str, arguments: dict) -> str:
    """The JSON body of a call, laid out as Qwen's template writes it (`{"name": ..., "arguments": {...}}`)."""
    return json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
