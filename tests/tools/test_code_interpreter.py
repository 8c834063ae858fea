"""The code interpreter owns its name, schema, code preparation, output text, run settings and viewer display."""

from tirl.chat.tool_formats.hermes import parse_tool_calls
from tirl.rollout.agent.loop import AgentConfig, AgentLoop
from tirl.tools import CodeInterpreter, ToolSet, default_tools, recorded_code, show_call, tool
from tirl.tools.code_interpreter import (
    CODE_INTERPRETER_SCHEMA,
    format_tool_output,
    prepare_code,
    tool_call_json,
)


@tool(sandbox=False)
def lookup(key: str) -> str:
    """Look up a key.

    Args:
        key: The key.
    """
    return key


def test_schema_is_the_recipes():
    assert CodeInterpreter().schema == {
        "type": "function",
        "function": {
            "name": "code_interpreter",
            "description": "A tool for executing code.",
            "parameters": {
                "type": "object",
                "properties": {"code": {"type": "string", "description": "The code to execute."}},
                "required": ["code"],
            },
        },
    }
    assert CODE_INTERPRETER_SCHEMA is CodeInterpreter().schema  # written once


def test_a_well_formed_call_is_checked_and_its_code_recorded():
    [call] = parse_tool_calls(
        "Let me compute.\n<tool_call>\n" + tool_call_json("print(1 + 1)") + "\n</tool_call>"
    )
    assert ToolSet(default_tools()).check(call) is None
    assert recorded_code(call.name, call.arguments) == "print(1 + 1)"


def test_bad_calls_get_error_text_and_record_no_code():
    cases = {
        '<tool_call>{"name": "browser", "arguments": {"code": "x"}}</tool_call>': "unknown tool 'browser'",
        '<tool_call>{"name": "code_interpreter", "arguments": {}}</tool_call>': "no 'code'",
        '<tool_call>{"name": "code_interpreter", "arguments": {"code": "  "}}</tool_call>': "no 'code'",
        '<tool_call>{"name": "code_interpreter", "arguments": {"code": 3}}</tool_call>': "no 'code'",
    }
    for text, expected in cases.items():
        [call] = parse_tool_calls(text)
        error = ToolSet(default_tools()).check(call)
        assert error is not None and expected in error, (text, error)
        assert recorded_code(call.name, call.arguments) in (None, "  "), text
    assert recorded_code("lookup", {"code": "x"}) is None  # another tool's argument named code is not code


def test_prepare_code_fence_and_auto_print():
    assert prepare_code("```python\nx = 2\nx * 3\n```") == "x = 2\nprint(x * 3)"
    assert prepare_code("x = 2\nprint(x)") == "x = 2\nprint(x)"
    assert prepare_code("x = 2") == "x = 2"  # an assignment is not printed (the recipe would break it)
    assert prepare_code("for i in range(2):\n    i") == "for i in range(2):\n    i"  # indented: left alone
    assert prepare_code("print(1") == "print(1"  # a syntax error is the sandbox's to report
    assert prepare_code("x = 1\nx", auto_print=False) == "x = 1\nx"
    assert prepare_code("(1 +\n 2)") == "print((1 +\n 2))"
    assert prepare_code("x = 2\nx  # show") == "x = 2\nprint(x)  # show"  # a trailing comment stays outside
    assert prepare_code("x;") == "print(x);"


def test_output_text_is_stdout_then_stderr_or_no_output():
    assert format_tool_output("1\n", "Traceback\n") == "1\nTraceback\n"
    assert format_tool_output("", " ") == "(no output)"
    assert format_tool_output("", "", timed_out=True) == "\nError: the code timed out."


def test_the_tool_takes_agent_auto_print_itself():
    built = CodeInterpreter(auto_print=True)
    tools = ToolSet([built, lookup]).configured(AgentConfig(auto_print=False))
    assert tools.tools["code_interpreter"].auto_print is False and tools.tools["lookup"] is lookup
    assert built.auto_print is True  # the task's own tool is left as it was
    same = ToolSet([built]).configured(AgentConfig(auto_print=True))
    assert same.tools["code_interpreter"] is built


def test_viewer_shows_code_for_the_interpreter_and_arguments_for_other_tools():
    assert show_call("code_interpreter", {"code": "print(1)"}) == "print(1)"
    assert show_call("code_interpreter", {"code": 3}) is None
    assert show_call("lookup", {"key": "H"}) == 'lookup({"key": "H"})'
    assert show_call(None, None) is None  # too malformed to name a tool


def test_the_agent_loop_hands_agent_auto_print_to_its_tools():
    """What commands/stages.py did by swapping the task's tool, the loop now asks of each tool."""
    off = AgentConfig(auto_print=False)
    given = AgentLoop(None, None, None, off, tools=ToolSet([CodeInterpreter()]))  # type: ignore[arg-type]
    default = AgentLoop(None, None, None, off)  # type: ignore[arg-type]
    assert given.tools.tools["code_interpreter"].auto_print is False
    assert default.tools.tools["code_interpreter"].auto_print is False
