"""The Hermes tool-call format of the reference recipe: parse a model's call, prepare its code, format the result.

The model writes `<tool_call>{"name": "code_interpreter", "arguments": {"code": "..."}}</tool_call>`. Anything
malformed (bad JSON, unknown tool, missing code) becomes a `ToolCall` with an `error` text that is fed back to the
model as the tool response: a broken call never crashes a rollout. Departure from the recipe: the recipe drops a
malformed call and ends the trajectory; tirl answers it with the error so the model can learn to fix it.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass

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
    """A parsed call: `code` to run, or `error` to send back instead of running anything."""

    raw: str
    name: str | None = None
    code: str | None = None
    error: str | None = None


def parse_tool_call(text: str) -> ToolCall | None:
    """The first tool call in an assistant turn, or None if the turn has none (then it is the final answer).

    An opening `<tool_call>` without its closing tag counts as a malformed call.
    """
    m = _CALL_RE.search(text)
    if m is None:
        if TOOL_CALL_START in text:
            raw = text[text.index(TOOL_CALL_START) :]
            return ToolCall(raw=raw, error=f"Error: the tool call is not closed with {TOOL_CALL_END}.")
        return None
    raw = m.group(1).strip()
    try:
        obj = json.loads(raw)
    except json.JSONDecodeError as e:
        return ToolCall(raw=raw, error=f"Error: the tool call is not valid JSON ({e.msg} at char {e.pos}).")
    if not isinstance(obj, dict):
        return ToolCall(
            raw=raw, error="Error: the tool call must be a JSON object with 'name' and 'arguments'."
        )
    name = obj.get("name")
    if name != TOOL_NAME:
        return ToolCall(
            raw=raw, name=str(name), error=f"Error: unknown tool {name!r}; available: {TOOL_NAME}."
        )
    args = obj.get("arguments")
    if isinstance(args, str):  # some models send the arguments as a JSON string
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            args = None
    code = args.get("code") if isinstance(args, dict) else None
    if not isinstance(code, str) or not code.strip():
        return ToolCall(raw=raw, name=name, error="Error: the tool call has no 'code' argument.")
    return ToolCall(raw=raw, name=name, code=code)


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
