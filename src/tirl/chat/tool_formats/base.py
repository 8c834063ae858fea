"""What every tool-call format shares: the parsed `ToolCall` record, the `ToolFormat` record a format module
declares, and the split of an assistant turn into its `<tool_call>...</tool_call>` blocks.

A format reads the syntax of a call; which names and arguments are valid is the task's tools' business
(`tirl.tools.ToolSet.check`). Anything malformed becomes a `ToolCall` with an `error` text that is fed back to the
model as the tool response: a broken call never crashes a rollout. Deliberately not here: any format's own syntax
(one module each, `tirl.chat.tool_formats.hermes`, `...qwen3_xml`) and the registry (`tirl.chat.tool_formats`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"


@dataclass(frozen=True)
class ToolCall:
    """A parsed call: the tool `name` and its `arguments`, or `error` to send back instead of running anything."""

    raw: str
    name: str | None = None
    error: str | None = None
    arguments: dict[str, Any] | None = None


# a tool's function schemas ({"type": "function", "function": {"name", "parameters"}}) as the task lists them
Schemas = Sequence[Mapping[str, Any]]


@dataclass(frozen=True)
class ToolFormat:
    """One tool-call format: how a call is written (`render`: the whole call text, tags included), read back
    (`parse_body`: the text between the tags, with the tools' schemas), and announced in the system turn
    (`tools_block`: the listing of the schemas and the instructions). `separator` goes between an assistant turn's
    content and its first call, and between calls. `end` is the stop string of a turn that calls a tool ("": none,
    the turn ends at the end-of-turn token). `parse_turn`, where set, reads a whole turn's calls itself (a format
    whose calls have no closing tag, `tirl.chat.tool_formats.json_calls`)."""

    name: str
    render: Callable[[str, Mapping[str, Any]], str]
    parse_body: Callable[[str, Schemas], ToolCall]
    tools_block: Callable[[Schemas], str]
    separator: str = "\n"
    start: str = TOOL_CALL_START
    end: str = TOOL_CALL_END
    parse_turn: Callable[[str, Schemas], list[ToolCall]] | None = None

    def parse(self, text: str, schemas: Schemas = (), limit: int | None = None) -> list[ToolCall]:
        """Every call of an assistant turn in order, at most `limit` (empty: the turn is the final answer).

        An opening tag without its closing tag after the last closed call counts as a malformed call."""
        if self.parse_turn is not None:
            found = self.parse_turn(text, schemas)
            return found[:limit] if limit is not None else found
        calls = []
        end = 0
        for m in _block_re(self.start, self.end).finditer(text):
            calls.append(self.parse_body(m.group(1).strip(), schemas))
            end = m.end()
        if self.start in text[end:]:
            raw = text[text.index(self.start, end) :]
            calls.append(ToolCall(raw=raw, error=f"Error: the tool call is not closed with {self.end}."))
        return calls[:limit] if limit is not None else calls

    def body(self, content: str, calls: Sequence[tuple[str, Mapping[str, Any]]]) -> str:
        """An assistant turn's text: its content, then each call, `separator` before each (none before a first
        call of an empty content)."""
        parts = [content]
        for i, (name, arguments) in enumerate(calls):
            if content or i:
                parts.append(self.separator)
            parts.append(self.render(name, arguments))
        return "".join(parts)

    def assistant_text(self, message: Mapping[str, Any]) -> str:
        """The text an assistant message (OpenAI form: `content`, `tool_calls`) generates in this format."""
        calls = []
        for c in message.get("tool_calls") or []:
            fn = c.get("function", c)
            args = fn["arguments"]
            calls.append((fn["name"], json.loads(args) if isinstance(args, str) else args))
        return self.body(message.get("content") or "", calls)


_BLOCKS: dict[tuple[str, str], re.Pattern[str]] = {}


def _block_re(start: str, end: str) -> re.Pattern[str]:
    if (start, end) not in _BLOCKS:
        _BLOCKS[start, end] = re.compile(re.escape(start) + r"(.*?)" + re.escape(end), re.DOTALL)
    return _BLOCKS[start, end]


def parameters_of(schemas: Schemas) -> dict[str, Mapping[str, Any]]:
    """Each tool's parameter schemas by tool name, then by parameter name (`{"code": {"type": "string"}}`)."""
    out: dict[str, Mapping[str, Any]] = {}
    for s in schemas:
        fn = s.get("function", s)
        if isinstance(fn.get("name"), str):
            out[fn["name"]] = (fn.get("parameters") or {}).get("properties") or {}
    return out
