"""Tool-call formats by registry: each format's calls read back as they were written (several argument shapes and
a seeded random sweep), Qwen3-Coder's own call text parses, and a malformed call gets the format's error text."""

import json
import random

import pytest

from tirl.chat.template import ChatRenderer
from tirl.chat.tool_formats import TOOL_FORMATS, tool_format
from tirl.chat.tool_formats.qwen3_xml import SHAPE

SCHEMAS = [
    {
        "type": "function",
        "function": {
            "name": "run",
            "description": "Run code.",
            "parameters": {
                "type": "object",
                "properties": {
                    "code": {"type": "string", "description": "The code."},
                    "timeout": {"type": "integer"},
                    "ratio": {"type": "number"},
                    "verbose": {"type": "boolean"},
                    "options": {"type": "object"},
                    "files": {"type": "array"},
                    "note": {"type": ["string", "null"]},
                },
                "required": ["code"],
            },
        },
    }
]

SHAPES = [
    {"code": "print(6 * 7)"},
    {
        "code": "def f(x):\n    if x < 3 and x > 1:\n        return '<b>' + \"q\"\n    return x\n\nprint(f(2))\n"
    },
    {"code": "\n\nleading and trailing blank lines\n\n"},
    {"code": 'a = "</function>"; b = \'<parameter=x>\'; print(a < b, {"k": [1, 2]})'},
    {"code": "", "timeout": 30, "ratio": 0.25, "verbose": False},
    {
        "code": "x",
        "options": {"nested": {"list": [1, "two", None]}, "s": "<tag>"},
        "files": ["a.py", "b <c>"],
    },
    {"code": "unicode: é ü 数 \\n (a literal backslash-n)", "note": "null"},
    {},
]


@pytest.mark.parametrize("name", list(TOOL_FORMATS))
@pytest.mark.parametrize("arguments", SHAPES)
def test_calls_read_back_as_written(name, arguments):
    fmt = tool_format(name)
    text = "Let me run it." + fmt.separator + fmt.render("run", arguments)
    [call] = fmt.parse(text, SCHEMAS)
    assert call.error is None, call.error
    assert call.name == "run" and call.arguments == arguments


def _random_value(rng: random.Random, kind: str):
    alphabet = "ab <>/=\n\t\"'{}[]:,\\é数`#"
    text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
    return {
        "code": text.replace("</parameter>", "").replace("</tool_call>", ""),
        "timeout": rng.randint(-(10**6), 10**6),
        "ratio": rng.choice([0.0, -1.5, 3.25, 1e-7]),
        "verbose": rng.random() < 0.5,
        "options": {"k": text, "n": [rng.randint(0, 9)]},
        "files": [text, text[:3]],
    }[kind]


@pytest.mark.parametrize("name", list(TOOL_FORMATS))
def test_random_arguments_read_back_as_written(name):
    fmt = tool_format(name)
    rng = random.Random(0)
    kinds = ["code", "timeout", "ratio", "verbose", "options", "files"]
    for _ in range(300):
        args = {k: _random_value(rng, k) for k in rng.sample(kinds, rng.randint(0, len(kinds)))}
        if "\n</parameter>" in args.get("code", "") or "</tool_call>" in json.dumps(args):
            continue  # what the XML markup cannot carry (the module docstring says so)
        calls = fmt.parse(fmt.body("", [("run", args), ("run", {"code": "1"})]), SCHEMAS)
        assert [c.arguments for c in calls] == [args, {"code": "1"}], args


def test_qwen3_coder_call_text_parses_with_types_from_the_schema():
    text = (
        "I will run it.\n\n<tool_call>\n<function=run>\n<parameter=code>\nfor i in range(3):\n    print(i)\n"
        "</parameter>\n<parameter=timeout>\n5\n</parameter>\n<parameter=verbose>\ntrue\n</parameter>\n"
        "</function>\n</tool_call>"
    )
    [call] = tool_format("qwen3_xml").parse(text, SCHEMAS)
    assert call.arguments == {"code": "for i in range(3):\n    print(i)", "timeout": 5, "verbose": True}
    # a parameter the schemas do not type stays text
    [untyped] = tool_format("qwen3_xml").parse(text)
    assert untyped.arguments == {
        "code": "for i in range(3):\n    print(i)",
        "timeout": "5",
        "verbose": "true",
    }


@pytest.mark.parametrize(
    "body, error",
    [
        ('{"name": "run"}', "has no <function=NAME>"),
        ("<function=run>\n<parameter=code>\nx\n</parameter>\n", "is not closed with </function>"),
        ("<function=>\n</function>", "empty function name"),
        ("<function=run>\nstray text\n</function>", "only parameter blocks may stand"),
        ("<function=run>\n<parameter=code>\nx\n</function>", "only parameter blocks may stand"),
        ("<function=run>\n<parameter=code>\na\n</parameter>\n<parameter=code>\nb\n</parameter>\n</function>",
         "'code' of 'run' is given twice"),
        ("<function=run>\n<parameter=timeout>\nsoon\n</parameter>\n</function>",
         "'timeout' of 'run' must be a JSON integer value"),
    ],
)  # fmt: skip
def test_malformed_xml_calls_get_the_formats_error_text(body, error):
    [call] = tool_format("qwen3_xml").parse(f"<tool_call>\n{body}\n</tool_call>", SCHEMAS)
    assert call.arguments is None and call.error.startswith("Error: ") and error in call.error
    if "JSON" not in error and "twice" not in error:
        assert SHAPE in call.error  # the message shows the shape the model must write


# json's calls have no closing tag: a call runs to the next header or the end of the turn
@pytest.mark.parametrize("name", [n for n, f in TOOL_FORMATS.items() if f.end])
def test_an_unclosed_call_is_an_error_not_a_crash(name):
    fmt = tool_format(name)
    text = fmt.render("run", {"code": "1"}) + "\n" + fmt.render("run", {"code": "2"}).removesuffix(fmt.end)
    first, second = fmt.parse(text, SCHEMAS)
    assert first.error is None and second.error == f"Error: the tool call is not closed with {fmt.end}."


def test_an_unknown_tool_format_lists_the_valid_ones():
    with pytest.raises(
        ValueError, match="unknown chat.tool_format 'json5'; valid: hermes, qwen3_xml, json, template"
    ):
        tool_format("json5")


def test_llama_json_calls_parse_with_either_key_and_after_whitespace():
    code = json.dumps({"name": "run", "parameters": {"code": 'print("<|python_tag|>")'}})
    text = f'Let me run both.<|python_tag|> {code}\n<|python_tag|>{{"name": "run", "arguments": {{"timeout": 5}}}}'
    first, second = tool_format("json").parse(text, SCHEMAS)
    assert first.arguments == {"code": 'print("<|python_tag|>")'} and first.error is None
    assert second.arguments == {"timeout": 5} and second.name == "run"
    assert tool_format("json").parse(text, SCHEMAS, limit=1) == [first]


@pytest.mark.parametrize(
    "after, error",
    [
        ('{"name": "run", "parameters": {"code": "x"', "is not valid JSON"),
        ('["run"]', 'must be a JSON object written as <|python_tag|>{"name": NAME'),
        ('{"name": "run", "parameters": "x = 1"}', "parameters of 'run' must be a JSON object"),
        ('{"name": "run", "parameters": {}} and then some prose', "only another call may follow a tool call"),
    ],
)
def test_malformed_json_calls_get_the_formats_error_text(after, error):
    [call] = tool_format("json").parse("<|python_tag|>" + after, SCHEMAS)
    assert call.arguments is None or "follow" in error
    assert call.error.startswith("Error: ") and error in call.error


def test_the_json_tools_block_lists_each_schema_as_indented_json():
    block = tool_format("json").tools_block(SCHEMAS[:1])
    assert block.startswith("Given the following functions, please respond with a JSON for a function call")
    assert '<|python_tag|>{"name": NAME, "parameters": {ARGUMENT: VALUE, ...}}' in block
    assert block.endswith(json.dumps(SCHEMAS[0], indent=4))


def test_the_xml_tools_block_lists_each_parameter_in_qwen3_coders_layout():
    block = tool_format("qwen3_xml").tools_block(SCHEMAS[:1])
    assert block.startswith("# Tools\n\nYou have access to the following functions:\n\n<tools>\n<function>\n")
    assert (
        "<name>run</name>\n<description>Run code.</description>\n<parameters>\n<parameter>\n<name>code</name>"
        in block
    )
    assert "\n<type>integer</type>\n</parameter>" in block and '\n<required>["code"]</required>' in block
    assert "</tools>\n\nIf you choose to call a function ONLY reply" in block and block.endswith(
        "</IMPORTANT>"
    )


def test_the_renderer_writes_and_lists_tools_in_its_tool_format(tokenizer):
    msgs = [
        {"role": "user", "content": "Run it."},
        {
            "role": "assistant",
            "content": "Sure.",
            "tool_calls": [{"function": {"name": "run", "arguments": {}}}],
        },
    ]
    xml = ChatRenderer(tokenizer, fmt="qwen2.5", tools=SCHEMAS, tool_format="qwen3_xml").text(msgs)
    assert "Sure.\n\n<tool_call>\n<function=run>\n</function>\n</tool_call><|im_end|>" in xml
    assert "<name>run</name>" in xml and '"name": "run"' not in xml
    hermes = ChatRenderer(tokenizer, fmt="qwen2.5", tools=SCHEMAS).text(msgs)
    assert 'Sure.\n<tool_call>\n{"name": "run", "arguments": {}}\n</tool_call><|im_end|>' in hermes
