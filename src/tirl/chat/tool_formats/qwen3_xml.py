"""Qwen3-Coder's XML tool calls (`chat.tool_format: qwen3_xml`): parse a model's calls, write one, list the tools.

A call, as Qwen3-Coder's chat template writes it:

    <tool_call>
    <function=code_interpreter>
    <parameter=code>
    print(6 * 7)
    </parameter>
    </function>
    </tool_call>

A parameter's value is raw text between `<parameter=KEY>\n` and `\n</parameter>` (one newline each side belongs to
the markup, as Qwen3-Coder's parser in vLLM strips them), JSON-decoded where the tool's schema gives the parameter
a type other than string (a parameter the schema does not know stays text). The system turn lists the tools in
Qwen3-Coder's `<tools><function><name>...` block with its instructions; the content and the first call are
separated by a blank line, as the template writes them.

Departures from Qwen3-Coder's template, both so that every call reads back as it was written: a non-string scalar
is written as JSON (`true`, `null`; the template's `| string` gives Python's `True`, `None`), and a value that
cannot be decoded as its schema's type is an error sent back to the model, not silently kept as text. What cannot
round-trip: a string value containing `\n</parameter>` (or `</tool_call>`, the turn's stop string), which the
markup cannot carry.
"""

from __future__ import annotations

import json
import re
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
    parameters_of,
)

FUNCTION_OPEN, FUNCTION_CLOSE = "<function=", "</function>"
PARAMETER_OPEN, PARAMETER_CLOSE = "<parameter=", "</parameter>"
_SPACE = re.compile(r"\s*")
SHAPE = "<tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n</function>\n</tool_call>"


def _value_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def render(name: str, arguments: Mapping[str, Any]) -> str:
    params = "".join(f"<parameter={k}>\n{_value_text(v)}\n</parameter>\n" for k, v in arguments.items())
    return f"{TOOL_CALL_START}\n<function={name}>\n{params}</function>\n{TOOL_CALL_END}"


def _is_text(schema: Mapping[str, Any] | None) -> bool:
    """Whether a parameter's value stays text: no schema, no type, or a type that admits a string."""
    kind = (schema or {}).get("type")
    return kind is None or kind == "string" or (isinstance(kind, list) and "string" in kind)


def _decode(name: str, key: str, text: str, schema: Mapping[str, Any] | None) -> tuple[Any, str | None]:
    if _is_text(schema):
        return text, None
    try:
        return json.loads(text), None
    except JSON_ERRORS as e:
        kind = (schema or {}).get("type")
        why = "" if isinstance(e, json.JSONDecodeError) else f" ({json_error(e)})"
        return (
            None,
            f"Error: parameter {key!r} of {name!r} must be a JSON {kind} value{why}, got {text[:80]!r}.",
        )


def _function(raw: str) -> tuple[str, str] | None:
    """(name, inner text) of a `<function=NAME>INNER</function>` block that is all of `raw` (a name runs to the
    first `>` and holds no newline), or None."""
    gt = raw.find(">", len(FUNCTION_OPEN))
    inner_end = len(raw) - len(FUNCTION_CLOSE)
    if not raw.startswith(FUNCTION_OPEN) or not raw.endswith(FUNCTION_CLOSE) or not 0 <= gt < inner_end:
        return None
    name = raw[len(FUNCTION_OPEN) : gt]
    return None if "\n" in name else (name, raw[gt + 1 : inner_end])


def _parameters(inner: str) -> tuple[list[tuple[str, str]], int]:
    """The `<parameter=KEY>VALUE</parameter>` blocks from the start of a function's inner text, whitespace
    around them allowed: (key, raw value) pairs and where the last one ends. Each block is found with `find` from
    the end of the one before, so the text is read once whatever it holds (an unclosed block ends the scan)."""
    pairs, pos = [], 0
    while True:
        at = _SPACE.match(inner, pos).end()  # type: ignore[union-attr]  # \s* always matches
        gt = inner.find(">", at + len(PARAMETER_OPEN))
        if not inner.startswith(PARAMETER_OPEN, at) or gt < 0:
            return pairs, pos
        close = inner.find(PARAMETER_CLOSE, gt + 1)
        key = inner[at + len(PARAMETER_OPEN) : gt]
        if close < 0 or "\n" in key:
            return pairs, pos
        pairs.append((key, inner[gt + 1 : close]))
        pos = close + len(PARAMETER_CLOSE)


def parse_body(raw: str, schemas: Schemas = ()) -> ToolCall:
    """One call's `<function=NAME>...</function>` block (the text between the tool-call tags, stripped)."""
    block = _function(raw)
    if block is None:
        what = "is not closed with </function>" if raw.startswith(FUNCTION_OPEN) else "has no <function=NAME>"
        return ToolCall(raw=raw, error=f"Error: the tool call {what}; write it as {SHAPE}.")
    name, inner = block[0].strip(), block[1]
    if not name:
        return ToolCall(
            raw=raw, error=f"Error: the tool call has an empty function name; write it as {SHAPE}."
        )
    props = parameters_of(schemas).get(name, {})
    args: dict[str, Any] = {}
    pairs, pos = _parameters(inner)
    for key, value in pairs:
        key, value = key.strip(), value.removeprefix("\n").removesuffix("\n")
        if key in args:
            return ToolCall(raw=raw, name=name, error=f"Error: parameter {key!r} of {name!r} is given twice.")
        args[key], err = _decode(name, key, value, props.get(key))
        if err:
            return ToolCall(raw=raw, name=name, error=err)
    if inner[pos:].strip():
        return ToolCall(
            raw=raw,
            name=name,
            error=f"Error: inside <function={name}> only parameter blocks may stand, found "
            f"{inner[pos:].strip()[:80]!r}; write it as {SHAPE}.",
        )
    return ToolCall(raw=raw, name=name, arguments=args)


def _extra_keys(obj: Mapping[str, Any], handled: tuple[str, ...]) -> str:
    """Qwen3-Coder's `render_extra_keys`: every other key as `<key>value</key>` (JSON for lists and mappings)."""
    out = ""
    for k, v in obj.items():
        if k not in handled:
            text = json.dumps(v, ensure_ascii=False) if isinstance(v, (dict, list)) else str(v)
            out += f"\n<{k}>{text}</{k}>"
    return out


def _tool_xml(tool: Mapping[str, Any]) -> str:
    fn = tool.get("function", tool)
    out = f"\n<function>\n<name>{fn['name']}</name>"
    if "description" in fn:
        out += f"\n<description>{str(fn['description']).strip()}</description>"
    out += "\n<parameters>"
    params = fn.get("parameters") or {}
    for pname, fields in (params.get("properties") or {}).items():
        out += f"\n<parameter>\n<name>{pname}</name>"
        if "type" in fields:
            out += f"\n<type>{fields['type']}</type>"
        if "description" in fields:
            out += f"\n<description>{str(fields['description']).strip()}</description>"
        out += _extra_keys(fields, ("name", "type", "description")) + "\n</parameter>"
    out += _extra_keys(params, ("type", "properties")) + "\n</parameters>"
    return out + _extra_keys(fn, ("type", "name", "description", "parameters")) + "\n</function>"


INSTRUCTIONS = (
    "\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n<tool_call>\n"
    "<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n"
    "<parameter=example_parameter_2>\nThis is the value for the second parameter\nthat can span\nmultiple lines\n"
    "</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\nReminder:\n- Function calls MUST follow the "
    "specified format: an inner <function=...></function> block must be nested within <tool_call></tool_call> "
    "XML tags\n- Required parameters MUST be specified\n- You may provide optional reasoning for your function "
    "call in natural language BEFORE the function call, but NOT after\n- If there is no function call available, "
    "answer the question like normal with your current knowledge and do not tell the user about function calls\n"
    "</IMPORTANT>"
)


def tools_block(tools: Schemas) -> str:
    """Qwen3-Coder's system text: the tools as XML, then how to call one."""
    listing = "".join(_tool_xml(t) for t in tools)
    return (
        f"# Tools\n\nYou have access to the following functions:\n\n<tools>{listing}\n</tools>{INSTRUCTIONS}"
    )


FORMAT = ToolFormat(
    "qwen3_xml", render=render, parse_body=parse_body, tools_block=tools_block, separator="\n\n"
)
