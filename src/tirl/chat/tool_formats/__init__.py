"""Tool-call formats by name (`chat.tool_format`): each is one module declaring a `ToolFormat` (its renderer, its
parser with the format's own error messages, its tools block), and one entry in `TOOL_FORMATS` below.

Adding a format: a module `tirl/chat/tool_formats/NAME.py` with `FORMAT = ToolFormat(NAME, render=...,
parse_body=..., tools_block=...)`, and its entry here. The renderer, the agent loop, `tirl check-tokens` and
`tirl data sample` read calls only through the `ToolFormat` the renderer holds. `chat.tool_format: template` (the
chat template writes the calls) reads them with the format `format_of_calls` finds here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tirl.chat.tool_formats import hermes, json_calls, qwen3_xml
from tirl.chat.tool_formats.base import TOOL_CALL_END, TOOL_CALL_START, Schemas, ToolCall, ToolFormat

TOOL_FORMATS: dict[str, ToolFormat] = {
    f.name: f for f in (hermes.FORMAT, qwen3_xml.FORMAT, json_calls.FORMAT)
}
TEMPLATE = "template"  # chat.tool_format=template: the chat template writes the calls (chat.format=template)
# the call the template checks render (`format_of_calls`, `tirl.chat.template_check.synthetic_conversation`): the
# first listed tool's name, or PROBE_TOOL where the caller lists none (a task without tools); any name would do
PROBE_TOOL = "code_interpreter"
PROBE_ARGUMENTS = {"code": "print(6 * 7)"}


def tool_format(name: str) -> ToolFormat:
    """The format `chat.tool_format=name`; an unknown name raises listing the valid ones."""
    if name not in TOOL_FORMATS:
        raise ValueError(f"unknown chat.tool_format {name!r}; valid: {', '.join([*TOOL_FORMATS, TEMPLATE])}")
    return TOOL_FORMATS[name]


def format_of_calls(write: Callable[[dict[str, Any]], str], schemas: Schemas = ()) -> ToolFormat:
    """The registered format whose parser reads back a probe call as `write` (the chat template's text of an
    assistant message with `tool_calls`) writes it; none: ValueError showing the text."""
    fn = schemas[0].get("function", schemas[0]) if schemas else {}
    name = str(fn.get("name", PROBE_TOOL))
    call = {"type": "function", "function": {"name": name, "arguments": dict(PROBE_ARGUMENTS)}}
    text = write({"role": "assistant", "content": "Let me check.", "tool_calls": [call]})
    for fmt in TOOL_FORMATS.values():
        if [(c.name, c.arguments, c.error) for c in fmt.parse(text, schemas)] == [
            (name, PROBE_ARGUMENTS, None)
        ]:
            return fmt
    what = "writes no call" if name not in text else "writes a call that no registered format reads back"
    raise ValueError(
        f"chat.tool_format=template: for an assistant message calling {name}({PROBE_ARGUMENTS}) the chat template "
        f"{what}: {text!r} (formats tried: {', '.join(TOOL_FORMATS)}); set chat.tool_format to the format the "
        "model writes its calls in, or add a format for this one (docs/data-and-rewards.md)"
    )


__all__ = [
    "PROBE_ARGUMENTS",
    "PROBE_TOOL",
    "TEMPLATE",
    "TOOL_CALL_END",
    "TOOL_CALL_START",
    "TOOL_FORMATS",
    "Schemas",
    "ToolCall",
    "ToolFormat",
    "format_of_calls",
    "tool_format",
]
