"""`chat.tool_format: template`: a template that writes tool calls itself (Qwen3-Coder's XML, Llama 3.1's JSON)
renders SFT rows' calls as it writes them, its calls are read with the registered format that reads back a probe
call, the turn-by-turn check passes, and a template whose calls no format reads is refused showing its text."""

import pytest
from family_templates import FAMILIES, LLAMA31, QWEN3_CODER, with_family_tokens

from conftest import sample_conversation
from tirl.chat.template import ChatRenderer
from tirl.tools.code_interpreter import CODE_INTERPRETER_SCHEMA

CASES = {
    "qwen3_coder": (QWEN3_CODER, "qwen3_xml", "I will compute it with Python.\n\n<tool_call>\n"
                    "<function=code_interpreter>\n<parameter=code>\nprint(12 * 34)\n</parameter>\n</function>\n"
                    "</tool_call>"),
    "llama31": (LLAMA31, "json", 'I will compute it with Python.<|python_tag|>{"name": "code_interpreter", '
                '"parameters": {"code": "print(12 * 34)"}}'),
}  # fmt: skip


def _renderer(tokenizer, template: str) -> ChatRenderer:
    tok = with_family_tokens(tokenizer, template)
    return ChatRenderer(tok, fmt="template", tool_format="template", tools=[CODE_INTERPRETER_SCHEMA])


@pytest.mark.parametrize("case", list(CASES))
def test_the_templates_own_call_is_trained_and_read_with_the_matching_format(tokenizer, case):
    template, name, call_text = CASES[case]
    r = _renderer(tokenizer, template)  # the turn-by-turn check runs here, on a conversation with a call
    assert r.tool_format.name == name
    conv = sample_conversation()
    ids, mask = r.render(conv)
    trained = r.tokenizer.decode([i for i, m in zip(ids, mask) if m])
    assert trained.startswith(call_text + r.eos_text)  # the template's own layout of the call is the target
    assert r.assistant_body(conv[1]) == call_text
    [call] = r.parse_calls(call_text)
    assert (call.name, call.arguments, call.error) == ("code_interpreter", {"code": "print(12 * 34)"}, None)


@pytest.mark.parametrize("case", list(CASES))
def test_the_loop_stream_with_the_templates_own_calls_is_the_whole_conversation(tokenizer, case):
    r = _renderer(tokenizer, CASES[case][0])
    conv = sample_conversation()
    ids = r.prompt_ids(conv[:1]) + r.encode(r.assistant_body(conv[1])) + [r.eos_id]
    ids += r.tool_response_ids([conv[2]["content"]], assistant_closed=True)
    ids += r.encode(conv[3]["content"]) + [r.eos_id]
    assert ids == r.render(conv)[0][: len(ids)]


def test_auto_with_the_templates_own_calls_is_the_template_format(tokenizer):
    tok = with_family_tokens(tokenizer, QWEN3_CODER)
    r = ChatRenderer(tok, fmt="auto", tool_format="template")
    assert r.fmt == "template" and r.tool_format.name == "qwen3_xml"
    with pytest.raises(
        ValueError, match="chat.tool_format=template needs chat.format=template or auto, not qwen3"
    ):
        ChatRenderer(tok, fmt="qwen3", tool_format="template")


def test_a_template_that_writes_no_call_is_refused(tokenizer):
    with pytest.raises(ValueError) as e:
        _renderer(tokenizer, FAMILIES["llama3"][0])  # it renders the content and drops tool_calls
    assert "chat.tool_format=template: for an assistant message calling code_interpreter" in str(e.value)
    assert "the chat template writes no call: 'Let me check.'" in str(e.value)


def test_a_call_no_registered_format_reads_back_is_refused_showing_its_text(tokenizer):
    odd = LLAMA31.replace("'<|python_tag|>{", "'[CALL]{")
    with pytest.raises(ValueError) as e:
        _renderer(tokenizer, odd)
    msg = str(e.value)
    assert 'writes a call that no registered format reads back: \'Let me check.[CALL]{"name": ' in msg
    assert "(formats tried: hermes, qwen3_xml, json)" in msg and "set chat.tool_format" in msg
