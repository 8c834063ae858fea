"""Llama-3.1-style JSON tool calls (`chat.tool_format: json`): parse a model's calls, write one, list the tools.

A call is a JSON object after Llama 3.1's `<|python_tag|>` header, with no closing tag: the turn ends at the
end-of-turn token (`<|eot_id|>`), so the format has no stop string of its own.

    Let me compute it.<|python_tag|>{"name": "code_interpreter", "parameters": {"code": "print(6 * 7)"}}

Several calls are several headers in a row. The object is read with a JSON decoder from just after its header, so a
string value may hold anything JSON can carry, the header's own text included. `"arguments"` is read as a synonym of
`"parameters"` (vLLM's `llama3_json` parser takes both); the renderer writes `"parameters"`, as Llama 3.1's
template does. Text after a call's object other than whitespace or the next header is an error sent back to the
model: what is parsed is what was written. The system turn lists the schemas as Llama 3.1's template lists them in
its first user turn (indented JSON, with the instruction to answer in this shape).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from tirl.chat.tool_formats.base import JSON_ERRORS, Schemas, ToolCall, ToolFormat, json_error

HEADER = "<|python_tag|>"
SHAPE = HEADER + '{"name": NAME, "parameters": {ARGUMENT: VALUE, ...}}'
_DECODER = json.JSONDecoder()
_SPACE = re.compile(r"\s*")
_WINDOW = 1024  # the first window a call is decoded in (it doubles until the decode's verdict lies inside it)
_LOOKAHEAD = 64  # the decoder reads at most this far past where it stops (`-Infinity`, a `\\uXXXX` pair: 12)


def _decode_at(text: str, at: int) -> tuple[Any, int]:
    """`raw_decode` from `text[at]`: (value, where it ends in `text`), or the decoder's error with its position
    counted from `at`. Decoded in windows of doubling length from `at`, kept once the verdict lies clear of the
    window's end: a JSONDecodeError counts the lines before its position, so on the whole turn every failed call
    would cost the length of the turn before it."""
    size = _WINDOW
    while True:
        window = text[at : at + size]
        whole = at + size >= len(text)
        try:
            obj, end = _DECODER.raw_decode(window)
        except json.JSONDecodeError as e:
            clear = e.pos < len(window) - _LOOKAHEAD and not e.msg.startswith("Unterminated string")
            if whole or clear:
                raise
        except RecursionError:
            raise  # as deep in the whole text as in its window
        except ValueError:  # a number too long: the whole text holds at least as many digits
            if whole:
                raise
        else:
            if whole or end < len(window) - _LOOKAHEAD:
                return obj, at + end
        size *= 2


def render(name: str, arguments: Mapping[str, Any]) -> str:
    return HEADER + json.dumps({"name": name, "parameters": dict(arguments)}, ensure_ascii=False)


def parse_body(raw: str, schemas: Schemas = ()) -> ToolCall:
    """One call's JSON object (the text after its header); the schemas are not needed (JSON carries types)."""
    try:
        obj = json.loads(raw)
    except JSON_ERRORS as e:
        return ToolCall(raw=raw, error=f"Error: the tool call is not valid JSON ({json_error(e)}).")
    return _call(raw, obj)


def _call(raw: str, obj: Any) -> ToolCall:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return ToolCall(raw=raw, error=f"Error: the tool call must be a JSON object written as {SHAPE}.")
    args = obj.get("parameters", obj.get("arguments", {}))
    if not isinstance(args, dict):
        return ToolCall(
            raw=raw,
            name=obj["name"],
            error=f"Error: the parameters of {obj['name']!r} must be a JSON object of named values.",
        )
    return ToolCall(raw=raw, name=obj["name"], arguments=args)


def parse_turn(text: str, schemas: Schemas = ()) -> list[ToolCall]:
    """Every call of an assistant turn in order: a JSON object after each header. Linear in the turn's length:
    whitespace is skipped by a match at the header, not by copying the rest of the turn; each decode reads a
    window of about what it reads (`_decode_at`); and when a decode runs on past later headers (inside its
    strings), the decodes from those headers stop by the header after (a header outside a string is a syntax
    error), so no stretch of the turn is read by more than two decodes."""
    calls: list[ToolCall] = []
    at = text.find(HEADER)
    while at >= 0:
        start = at + len(HEADER)
        lead = _SPACE.match(text, start).end() - start  # type: ignore[union-attr]  # \s* always matches
        try:
            obj, end = _decode_at(text, start + lead)
        except JSON_ERRORS as e:
            at = text.find(HEADER, start)
            raw = text[start : at if at >= 0 else len(text)].strip()
            msg = f"Error: the tool call is not valid JSON ({json_error(e)}); write it as"
            calls.append(ToolCall(raw=raw, error=f"{msg} {SHAPE}."))
            continue
        at = text.find(HEADER, end)
        rest = text[end : at if at >= 0 else len(text)].strip()
        call = _call(text[start + lead : end], obj)
        if rest and call.error is None:
            call = ToolCall(
                raw=call.raw,
                name=call.name,
                error=f"Error: only another call may follow a tool call, found {rest[:80]!r}; write each as "
                f"{SHAPE}.",
            )
        calls.append(call)
    return calls


INSTRUCTIONS = (
    "Given the following functions, please respond with a JSON for a function call with its proper arguments "
    f"that best answers the given prompt.\n\nRespond in the format {SHAPE}. Do not use variables.\n\n"
)


def tools_block(tools: Schemas) -> str:
    """Llama 3.1's listing: the instruction, then each schema as indented JSON, blank lines between."""
    return INSTRUCTIONS + "\n\n".join(json.dumps(t, indent=4, ensure_ascii=False) for t in tools)


FORMAT = ToolFormat(
    "json",
    render=render,
    parse_body=parse_body,
    tools_block=tools_block,
    separator="",
    start=HEADER,
    end="",
    parse_turn=parse_turn,
)
