"""`chat.format: template`: any family's chat template renders turn by turn as the whole conversation, checked
before use; a template that re-renders history is refused with its first divergence; `auto` picks a hand-written
format where the template is one."""

import pytest
from family_templates import DROPS_SEPARATOR, FAMILIES, STRIPS_REASONING, with_family_tokens

from conftest import TOOL, sample_conversation
from tirl.chat.template import CHATML_JINJA, ChatRenderer
from tirl.chat.template_check import synthetic_conversation
from tirl.tools.code_interpreter import CODE_INTERPRETER_SCHEMA


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_family_template_renders_pieces_as_the_whole_text_with_masks_on_assistant_turns(tokenizer, family):
    template, eos = FAMILIES[family]
    tok = with_family_tokens(tokenizer, template)
    r = ChatRenderer(tok, fmt="template", tools=[CODE_INTERPRETER_SCHEMA])  # the check runs here
    assert r.fmt == "template" and r.eos_text == eos and r.eos_id == tok.convert_tokens_to_ids(eos)
    conv = synthetic_conversation()
    ids, mask = r.render(conv)
    flat = [{**m, "content": r.assistant_body(m)} if m["role"] == "assistant" else m for m in conv]
    whole = tok.apply_chat_template(flat, tools=[CODE_INTERPRETER_SCHEMA], tokenize=False)
    assert tok.decode(ids) == whole
    trained = tok.decode([i for i, m in zip(ids, mask) if m])
    assert trained == "".join(r.assistant_body(m) + eos for m in conv if m["role"] == "assistant")


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_loop_stream_of_a_family_template_is_the_whole_conversation(tokenizer, family):
    tok = with_family_tokens(tokenizer, FAMILIES[family][0])
    r = ChatRenderer(tok, fmt="template")
    conv = sample_conversation()
    ids = r.prompt_ids(conv[:1])
    ids += r.encode(r.assistant_body(conv[1]))  # a turn stopped at </tool_call>: the loop appends the EOS
    ids += r.tool_response_ids([conv[2]["content"]], assistant_closed=False)
    ids += r.encode(conv[3]["content"]) + [r.eos_id]
    assert ids == r.render(conv)[0][: len(ids)]


def test_a_template_that_strips_earlier_reasoning_is_refused_with_its_first_divergence(tokenizer):
    tok = with_family_tokens(tokenizer, STRIPS_REASONING)
    with pytest.raises(ValueError) as e:
        ChatRenderer(tok, fmt="template")
    msg = str(e.value)
    assert (
        "re-renders history: adding message 3 (tool) changes the text rendered before it at character" in msg
    )
    assert "before: '" in msg and "<think>" in msg.split("before:")[1].split("after :")[0]
    assert "<think>" not in msg.split("after :")[1]


def test_a_template_that_drops_a_separator_at_a_tool_turn_is_refused(tokenizer):
    tok = with_family_tokens(tokenizer, DROPS_SEPARATOR)
    with pytest.raises(ValueError, match=r"adding message 3 \(tool\) changes the text") as e:
        ChatRenderer(tok, fmt="template")
    assert "<|im_end|>\\n" in str(e.value) and "<|im_end|><|im_start|>user" in str(e.value)


def test_a_template_that_cannot_render_a_role_names_it(tokenizer):
    tok = with_family_tokens(tokenizer, FAMILIES["mistral"][0].replace("'tool'", "'function'"))
    with pytest.raises(ValueError, match=r"cannot render a conversation of roles \[.*tool.*Only system"):
        ChatRenderer(tok, fmt="template")


def test_auto_picks_the_hand_written_format_the_template_is_else_template(tokenizer):
    assert tokenizer.chat_template == CHATML_JINJA
    assert ChatRenderer(tokenizer, fmt="auto").fmt == "chatml"
    assert ChatRenderer(with_family_tokens(tokenizer, FAMILIES["gemma"][0]), fmt="auto").fmt == "template"


def test_the_chatml_template_through_template_gives_chatmls_ids(tokenizer):
    """The tiny models' ChatML Jinja rendered by `template` gives the ids the hand-written format gives."""
    conv = [
        {"role": "user", "content": "What is 12 * 34?"},
        {"role": "assistant", "content": "x", "tool_calls": [TOOL]},
    ]
    conv += [{"role": "tool", "content": "408\n"}, {"role": "assistant", "content": "\\boxed{408}"}]
    hand, tpl = ChatRenderer(tokenizer), ChatRenderer(tokenizer, fmt="template")
    assert tpl.eos_id == hand.eos_id and tpl.render(conv) == hand.render(conv)
    assert tpl.prompt_ids(conv[:1]) == hand.prompt_ids(conv[:1])
    assert tpl.tool_response_ids(["408\n"], assistant_closed=False) == hand.tool_response_ids(
        ["408\n"], assistant_closed=False
    )
