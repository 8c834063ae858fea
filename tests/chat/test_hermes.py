import json

from tirl.chat.hermes import parse_tool_call, prepare_code, tool_call_json, truncate_middle


def test_well_formed_call():
    text = "Let me compute.\n<tool_call>\n" + tool_call_json("print(1 + 1)") + "\n</tool_call>"
    call = parse_tool_call(text)
    assert call is not None and call.error is None
    assert call.name == "code_interpreter" and call.code == "print(1 + 1)"


def test_no_call_is_final_answer():
    assert parse_tool_call("The answer is \\boxed{3}.") is None


def test_first_call_wins():
    text = "<tool_call>" + tool_call_json("print(1)") + "</tool_call><tool_call>" + tool_call_json("print(2)")
    assert parse_tool_call(text + "</tool_call>").code == "print(1)"


def test_arguments_as_json_string():
    raw = json.dumps({"name": "code_interpreter", "arguments": json.dumps({"code": "print(5)"})})
    assert parse_tool_call(f"<tool_call>{raw}</tool_call>").code == "print(5)"


def test_malformed_calls_get_error_text():
    cases = {
        "<tool_call>{not json}</tool_call>": "not valid JSON",
        '<tool_call>["a list"]</tool_call>': "JSON object",
        '<tool_call>{"name": "browser", "arguments": {"code": "x"}}</tool_call>': "unknown tool 'browser'",
        '<tool_call>{"name": "code_interpreter", "arguments": {}}</tool_call>': "no 'code'",
        '<tool_call>{"name": "code_interpreter", "arguments": {"code": "  "}}</tool_call>': "no 'code'",
        '<tool_call>{"name": "code_interpreter", "arguments": {"code": "print(1)"}}': "not closed",
    }
    for text, expected in cases.items():
        call = parse_tool_call(text)
        assert call is not None and call.code is None, text
        assert expected in call.error, (text, call.error)
        assert call.error.startswith("Error:")


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


def test_truncate_middle():
    text = "a" * 200 + "b" * 200
    out = truncate_middle(text, 256)
    assert out.startswith("a" * 128) and out.endswith("b" * 128) and "...(truncated)..." in out
    assert truncate_middle("short", 256) == "short"
