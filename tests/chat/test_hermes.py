import json

from tirl.chat.tool_formats.hermes import call_json, parse_tool_calls
from tirl.tools.base import truncate_middle


def test_well_formed_call():
    text = "Let me compute.\n<tool_call>\n" + call_json("lookup", {"key": "H"}) + "\n</tool_call>"
    [call] = parse_tool_calls(text)
    assert call.error is None and call.name == "lookup" and call.arguments == {"key": "H"}


def test_no_call_is_final_answer():
    assert parse_tool_calls("The answer is \\boxed{3}.") == []


def test_limit_keeps_the_first_calls():
    text = (
        "<tool_call>" + call_json("a", {}) + "</tool_call><tool_call>" + call_json("b", {}) + "</tool_call>"
    )
    assert [c.name for c in parse_tool_calls(text, limit=1)] == ["a"]


def test_arguments_as_json_string():
    raw = json.dumps({"name": "lookup", "arguments": json.dumps({"key": "He"})})
    assert parse_tool_calls(f"<tool_call>{raw}</tool_call>")[0].arguments == {"key": "He"}


def test_malformed_syntax_gets_error_text():
    cases = {
        "<tool_call>{not json}</tool_call>": "not valid JSON",
        '<tool_call>["a list"]</tool_call>': "JSON object",
        '<tool_call>{"name": "lookup", "arguments": [1]}</tool_call>': "JSON object of named values",
        '<tool_call>{"name": "lookup", "arguments": {"key": "H"}}': "not closed",
    }
    for text, expected in cases.items():
        [call] = parse_tool_calls(text)
        assert call.error is not None and expected in call.error, (text, call.error)
        assert call.error.startswith("Error:")


def test_truncate_middle():
    text = "a" * 200 + "b" * 200
    out = truncate_middle(text, 256)
    assert out.startswith("a" * 128) and out.endswith("b" * 128) and "...(truncated)..." in out
    assert truncate_middle("short", 256) == "short"
