"""OpenAI chat messages as the endpoint reads and answers them: their text, their tool calls, and whether an
assistant message the program sends back is the one the endpoint returned. Pure: no I/O."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from tirl.chat.tool_formats.base import ToolCall


class RequestError(ValueError):
    """A request the endpoint refuses: `status` the HTTP status, `code` OpenAI's error code."""

    def __init__(self, message: str, status: int = 400, code: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.code = status, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": str(self), "type": "invalid_request_error", "code": self.code}}


def text_of(content: Any) -> str:
    """A message's content as text: a string, or OpenAI's list of parts (their `text`); None is empty."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [
            p.get("text", "") for p in content if isinstance(p, Mapping) and p.get("type", "text") == "text"
        ]
        if len(parts) == len(content):
            return "".join(str(p) for p in parts)
    raise RequestError(f"message content must be a string or a list of text parts, got {str(content)[:200]}")


def _arguments(raw: Any) -> Any:
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except ValueError:
            return raw
    return raw


def calls_of(message: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """(name, arguments) of an assistant message's `tool_calls`, arguments decoded from their JSON string."""
    out = []
    for c in message.get("tool_calls") or []:
        fn = c.get("function", c) if isinstance(c, Mapping) else None
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
            raise RequestError(f"a tool call needs function.name, got {str(c)[:200]}")
        out.append((fn["name"], _arguments(fn.get("arguments", "{}"))))
    return out


def normal(message: Any) -> dict[str, Any]:
    """The parts of a message that decide its tokens: role, text, tool calls (ids and empty fields dropped)."""
    if not isinstance(message, Mapping) or message.get("role") not in ("system", "user", "assistant", "tool"):
        raise RequestError(
            f"each message needs a role of system, user, assistant or tool, got {str(message)[:200]}"
        )
    out: dict[str, Any] = {"role": message["role"], "content": text_of(message.get("content"))}
    if message["role"] == "assistant" and message.get("tool_calls"):
        out["tool_calls"] = [
            {"type": "function", "function": {"name": n, "arguments": a}} for n, a in calls_of(message)
        ]
    return out


def messages_of(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty list of chat messages")
    return [normal(m) for m in messages]


def tools_of(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The request's function schemas, in the form the chat renderer lists (OpenAI's)."""
    tools = body.get("tools") or []
    if not isinstance(tools, list) or not all(
        isinstance(t, Mapping) and isinstance(t.get("function"), Mapping) and "name" in t["function"]
        for t in tools
    ):
        raise RequestError("tools must be a list of {type: function, function: {name, parameters}}")
    return [dict(t) for t in tools]


def reply(text: str, calls: Sequence[ToolCall], start: str, eos_text: str, call_id: str) -> dict[str, Any]:
    """The assistant message for a sampled turn: the text before the first call as content, the well-formed calls
    as `tool_calls` (a malformed call stays in the content, where the program sees what the model wrote)."""
    good = [c for c in calls if c.error is None and c.name is not None]
    body = text[: -len(eos_text)] if eos_text and text.endswith(eos_text) else text
    content = body.split(start, 1)[0].rstrip("\n") if good else body
    out: dict[str, Any] = {"role": "assistant", "content": content}
    if good:
        out["tool_calls"] = [
            {
                "id": f"{call_id}_{j}",
                "type": "function",
                "function": {"name": c.name, "arguments": json.dumps(c.arguments or {})},
            }
            for j, c in enumerate(good)
        ]
    return out
