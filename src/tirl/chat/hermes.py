"""The Hermes tool-call format of the reference recipe: parse a model's call, prepare its code, format the result.

The model writes `<tool_call>{"name": "code_interpreter", "arguments": {"code": "..."}}</tool_call>`, one or more
per turn. `parse_tool_calls` reads the syntax; which names and arguments are valid is the task's tools' business
(`tirl.tools.ToolSet.check`). Anything malformed becomes a `ToolCall` with an `error` text that is fed back to the
model as the tool response: a broken call never crashes a rollout. The recipe instead drops a malformed call, and a
turn with no valid call left ends the trajectory: `agent.malformed_calls=drop` (rollout/agent.py) does that.
"""

from __future__ import annotations

import ast
import json
import re
import warnings
from dataclasses import dataclass
from typing import Any

TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"
TOOL_NAME = "code_interpreter"

_CALL_RE = re.compile(re.escape(TOOL_CALL_START) + r"(.*?)" + re.escape(TOOL_CALL_END), re.DOTALL)
_FENCE_RE = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.DOTALL)

CODE_INTERPRETER_SCHEMA = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": "A tool for executing code.",
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "The code to execute."}},
            "required": ["code"],
        },
    },
}


@dataclass(frozen=True)
class ToolCall:
    """A parsed call: the tool `name` and its `arguments`, or `error` to send back instead of running anything.

    `code` is the code_interpreter's code argument (None for other tools)."""

    raw: str
    name: str | None = None
    code: str | None = None
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
    code = args.get("code") if name == TOOL_NAME and isinstance(args.get("code"), str) else None
    return ToolCall(raw=raw, name=name, code=code, arguments=args)


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


def parse_tool_call(text: str) -> ToolCall | None:
    """The first call of a turn checked as a code_interpreter call (None: no call; the turn is the answer)."""
    calls = parse_tool_calls(text, limit=1)
    if not calls:
        return None
    call = calls[0]
    if call.error is not None:
        return call
    if call.name != TOOL_NAME:
        return ToolCall(
            raw=call.raw, name=call.name, error=f"Error: unknown tool {call.name!r}; available: {TOOL_NAME}."
        )
    if not call.code or not call.code.strip():
        return ToolCall(raw=call.raw, name=call.name, error="Error: the tool call has no 'code' argument.")
    return call


def prepare_code(code: str, *, auto_print: bool = True) -> str:
    """The code to run: the first fenced python block if any, and (as the recipe) print a bare final expression.

    The recipe wraps the last line in print() textually, which breaks indented or assignment lines; here the
    last statement is wrapped only if it parses as an expression that is not already a print() call.
    """
    m = _FENCE_RE.search(code)
    if m:
        code = m.group(1).strip()
    if not auto_print:
        return code
    try:
        with (
            warnings.catch_warnings()
        ):  # model code's SyntaxWarnings ("1x") belong in the sandbox's stderr, not ours
            warnings.simplefilter("ignore", SyntaxWarning)
            tree = ast.parse(code)
    except SyntaxError:
        return code  # let the sandbox report the syntax error to the model
    if not tree.body or not isinstance(tree.body[-1], ast.Expr):
        return code
    last = tree.body[-1]
    if isinstance(last.value, ast.Call) and getattr(last.value.func, "id", None) == "print":
        return code
    if last.col_offset != 0:  # e.g. `x = 1; x` on one line: leave it alone
        return code
    lines = code.splitlines()
    start, end = last.lineno - 1, (last.end_lineno or last.lineno) - 1
    expr = ast.get_source_segment(code, last)
    rest = lines[end][last.end_col_offset :]  # a trailing comment or `;` stays outside the print()
    return "\n".join([*lines[:start], f"print({expr}){rest}", *lines[end + 1 :]])


def format_tool_output(stdout: str, stderr: str, *, timed_out: bool = False) -> str:
    """What the model sees: stdout then stderr (tracebacks included), as the recipe's sandbox tool."""
    text = stdout + stderr
    if timed_out:
        text += "\nError: the code timed out."
    return text if text.strip() else "(no output)"


def truncate_middle(text: str, max_chars: int = 256, *, marker: str = "...(truncated)...") -> str:
    """Keep the first and last max_chars/2 characters (the recipe's `middle` mode)."""
    if max_chars <= 0 or len(text) <= max_chars:
        return text
    half = max_chars // 2
    return text[:half] + marker + text[len(text) - (max_chars - half) :]


def call_json(name: str, arguments: dict) -> str:
    """The JSON body of a call, laid out as Qwen's template writes it (`{"name": ..., "arguments": {...}}`)."""
    return json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)


def tool_call_json(code: str) -> str:
    """The body of a well-formed code_interpreter call."""
    return call_json(TOOL_NAME, {"code": code})
