"""Tool-call formats by name (`chat.tool_format`): each is one module declaring a `ToolFormat` (its renderer, its
parser with the format's own error messages, its tools block), and one entry in `TOOL_FORMATS` below.

Adding a format: a module `tirl/chat/tool_formats/NAME.py` with `FORMAT = ToolFormat(NAME, render=...,
parse_body=..., tools_block=...)`, and its entry here. The renderer, the agent loop, `tirl check-tokens` and
`tirl data sample` read calls only through the `ToolFormat` the renderer holds.
"""

from __future__ import annotations

from tirl.chat.tool_formats import hermes, qwen3_xml
from tirl.chat.tool_formats.base import TOOL_CALL_END, TOOL_CALL_START, Schemas, ToolCall, ToolFormat

TOOL_FORMATS: dict[str, ToolFormat] = {f.name: f for f in (hermes.FORMAT, qwen3_xml.FORMAT)}


def tool_format(name: str) -> ToolFormat:
    """The format `chat.tool_format=name`; an unknown name raises listing the valid ones."""
    if name not in TOOL_FORMATS:
        raise ValueError(f"unknown chat.tool_format {name!r}; valid: {', '.join(TOOL_FORMATS)}")
    return TOOL_FORMATS[name]


__all__ = [
    "TOOL_CALL_END",
    "TOOL_CALL_START",
    "TOOL_FORMATS",
    "Schemas",
    "ToolCall",
    "ToolFormat",
    "tool_format",
]
