"""What every tool-call format shares: the parsed `ToolCall` record, the `ToolFormat` record a format module
declares, and the split of an assistant turn into its `<tool_call>...</tool_call>` blocks.

A format reads the syntax of a call; which names and arguments are valid is the task's tools' business
(`tirl.tools.ToolSet.check`). Anything malformed becomes a `ToolCall` with an `error` text that is fed back to the
model as the tool response: a broken call never crashes a rollout, whatever it holds (nesting deeper than the JSON
decoder's recursion, a number too long for Python's integer conversion, an unpaired surrogate). Every parser reads
a turn in time linear in its length (`find` from where the last call ended, no backtracking search), so a turn of
thousands of unclosed tags costs what reading it once does. Deliberately not here: any format's own syntax
(one module each, `tirl.chat.tool_formats.hermes`, `...qwen3_xml`) and the registry (`tirl.chat.tool_formats`).
"""

from __future__ import annotations

import json
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
        calls = self.parse_turn(text, schemas) if self.parse_turn is not None else self._blocks(text, schemas)
        return [fit(c) for c in (calls[:limit] if limit is not None else calls)]

    def _blocks(self, text: str, schemas: Schemas) -> list[ToolCall]:
        """Each `start ... end` block's call; the text after an opening tag with no closing tag is one malformed
        call (a block is the opening tag up to the nearest closing tag, so the scan never goes back)."""
        calls = []
        at = text.find(self.start)
        while at >= 0:
            body = at + len(self.start)
            close = text.find(self.end, body)
            if close < 0:
                calls.append(
                    ToolCall(raw=text[at:], error=f"Error: the tool call is not closed with {self.end}.")
                )
                break
            calls.append(self.parse_body(text[body:close].strip(), schemas))
            at = text.find(self.start, close + len(self.end))
        return calls

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


# what a call's JSON may raise besides JSONDecodeError: RecursionError (nesting deeper than the interpreter's
# recursion limit), ValueError (an integer of more than sys.get_int_max_str_digits() digits, 4300 by default)
JSON_ERRORS = (ValueError, RecursionError)
# the nesting a call's arguments may have: deeper ones are refused, so that no later json.dumps of them recurses
MAX_DEPTH = 64


def json_error(e: BaseException) -> str:
    """Why a call's JSON could not be read, for the model."""
    if isinstance(e, json.JSONDecodeError):
        return f"{e.msg} at char {e.pos}"
    if isinstance(e, RecursionError):
        return "nested too deeply"
    return str(e).split(";")[0]  # the integer limit's message, without its advice to the Python programmer


def unfit(value: Any) -> str | None:
    """Why a parsed value cannot be carried through a run (nested deeper than `MAX_DEPTH`, a string that is not
    UTF-8: an unpaired surrogate from a `\\ud800` escape), or None. Iterative: the value may be deep."""
    stack = [(value, 0)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                return "holds an unpaired surrogate"
        elif isinstance(v, (dict, list)):
            if depth >= MAX_DEPTH:
                return f"is nested deeper than {MAX_DEPTH} levels"
            items = [*v.keys(), *v.values()] if isinstance(v, dict) else v
            stack += [(x, depth + 1) for x in items]
    return None


def fit(call: ToolCall) -> ToolCall:
    """`call`, or an error call when its name or arguments cannot be carried through a run (`unfit`)."""
    if call.error is None and (why := unfit(call.name) or unfit(call.arguments)) is not None:
        return ToolCall(raw=call.raw, error=f"Error: the tool call {why}.")
    return call


def parameters_of(schemas: Schemas) -> dict[str, Mapping[str, Any]]:
    """Each tool's parameter schemas by tool name, then by parameter name (`{"code": {"type": "string"}}`)."""
    out: dict[str, Mapping[str, Any]] = {}
    for s in schemas:
        fn = s.get("function", s)
        if isinstance(fn.get("name"), str):
            out[fn["name"]] = (fn.get("parameters") or {}).get("properties") or {}
    return out
