"""The recipe's `code_interpreter`, everything about it in one place: its name and schema, how the model's code is
prepared (first fenced block; `auto_print` prints a bare last expression), how a result reads to the model, how
a call is shown in the trajectory viewer, and the default tool set of a task and of the agent loop.

Everyone else asks this module: the chat renderer lists the schemas it is given and knows no tool (chat/ lies
below tools/), the agent loop hands its `agent.*` settings to its tools (`ToolSet.configured`), SFT writers and
the demo's solver format outputs with `format_tool_output`. Deliberately not here: the call syntax
(`tirl.chat.tool_formats`, shared by every tool) and running code (`tirl.sandbox`).
"""

from __future__ import annotations

import ast
import re
import warnings
from collections.abc import Sequence
from typing import Any

from tirl.chat.tool_formats.hermes import call_json
from tirl.sandbox.types import Sandbox
from tirl.tools.base import Tool, ToolOptions, ToolOutput
from tirl.tools.registry import register_tool
from tirl.tools.schema import check_arguments

TOOL_NAME = "code_interpreter"

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

_FENCE_RE = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.DOTALL)


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


def tool_call_json(code: str) -> str:
    """The body of a well-formed code_interpreter call."""
    return call_json(TOOL_NAME, {"code": code})


class CodeInterpreter(Tool):
    """The recipe's `code_interpreter`: the model's Python, run in the sandbox; one sandbox batch per step."""

    def __init__(self, *, auto_print: bool = True) -> None:
        self.name = TOOL_NAME
        self.schema = CODE_INTERPRETER_SCHEMA
        self.sandbox = True
        self.auto_print = auto_print

    def configured(self, options: ToolOptions) -> CodeInterpreter:
        """`agent.auto_print` decides whether a bare last expression is printed, whatever the task built."""
        return (
            self if self.auto_print == options.auto_print else CodeInterpreter(auto_print=options.auto_print)
        )

    def validate(self, arguments: dict[str, Any]) -> str | None:
        code = arguments.get("code")
        if not isinstance(code, str) or not code.strip():
            return "Error: the tool call has no 'code' argument."
        return check_arguments(self.schema, arguments)

    def recorded_code(self, arguments: dict[str, Any] | None) -> str | None:
        """The code the call carried (None when it carried none)."""
        code = (arguments or {}).get("code")
        return code if isinstance(code, str) else None

    def show(self, arguments: dict[str, Any] | None) -> str | None:
        """The code itself (None when the call carried none)."""
        return self.recorded_code(arguments)

    def run_batch(self, arguments: Sequence[dict[str, Any]], sandbox: Sandbox | None) -> list[ToolOutput]:
        if sandbox is None:
            raise ValueError("code_interpreter needs a sandbox")
        results = sandbox.run_batch([prepare_code(a["code"], auto_print=self.auto_print) for a in arguments])
        out = []
        for r in results:
            text = format_tool_output(r.stdout, r.stderr, timed_out=r.timed_out)
            if r.sandbox_error:
                text = f"Error: the sandbox failed: {r.sandbox_error}"
            out.append(ToolOutput(text, r.status, r.to_dict()))
        return out


def default_tools() -> tuple[Tool, ...]:
    """The tools of a task that names none, and of an agent loop given none: the code interpreter."""
    return (CodeInterpreter(),)


register_tool(CodeInterpreter())  # trajectory records and the viewer find it by name
