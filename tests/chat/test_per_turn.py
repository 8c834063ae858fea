"""`chat.history: per_turn`: a template that re-renders history is trained one sample per assistant turn (the
prompt is the template's own rendering before the turn, the loss is on the turn alone), and every token stream a
sampler would build from it is refused naming the template's divergence."""

import pytest
from family_templates import FAMILIES, STRIPS_REASONING, with_family_tokens

from conftest import sample_conversation
from tirl.chat.template import ChatRenderer
from tirl.chat.template_check import synthetic_conversation
from tirl.commands.run_config import ChatConfig


def _flat(r: ChatRenderer, conv: list[dict]) -> list[dict]:
    """The conversation as the template reads it: assistant calls written into the content."""
    return [{**m, "content": r.assistant_body(m)} if m["role"] == "assistant" else m for m in conv]


@pytest.fixture()
def strips(tokenizer):
    return with_family_tokens(tokenizer, STRIPS_REASONING)


def test_each_assistant_turn_is_a_sample_prompted_with_the_templates_own_rendering(strips):
    r = ChatRenderer(strips, fmt="template", history="per_turn")
    conv = synthetic_conversation()
    samples = r.samples(conv)
    turns = [k for k, m in enumerate(conv) if m["role"] == "assistant"]
    assert len(samples) == len(turns) == 3
    for (ids, mask), k in zip(samples, turns, strict=True):
        prompt = strips.apply_chat_template(_flat(r, conv[:k]), tokenize=False, add_generation_prompt=True)
        target = r.assistant_body(conv[k]) + "<|im_end|>"
        n = len(strips.encode(prompt, add_special_tokens=False))
        assert ids[:n] == strips.encode(prompt, add_special_tokens=False)
        assert strips.decode(ids[n:]) == target  # nothing follows the turn's end-of-turn token
        assert mask == [0] * n + [1] * (len(ids) - n)  # the loss covers exactly the target turn
    # the last prompt is the template's history, earlier reasoning stripped, as a served model would see it
    last_prompt = strips.decode(samples[-1][0][: samples[-1][1].index(1)])
    assert "I should compute it." not in last_prompt and "Let me compute it." in last_prompt


def test_per_turn_keeps_the_divergence_exact_refuses(strips):
    r = ChatRenderer(strips, fmt="template", history="per_turn")
    assert r.divergence.startswith("the chat template re-renders history: adding message 3 (tool)")
    with pytest.raises(ValueError, match=r"re-renders history: adding message 3 \(tool\)"):
        ChatRenderer(strips, fmt="template")


def test_sampling_streams_are_refused_naming_the_divergence(strips):
    r = ChatRenderer(strips, fmt="template", history="per_turn")
    with pytest.raises(ValueError) as e:
        r.prompt_ids(sample_conversation()[:1])
    msg = str(e.value)
    assert msg.startswith("chat.history=per_turn: sampling needs each conversation as one token stream")
    assert "adding message 3 (tool) changes the text rendered before it" in msg and "before: '" in msg
    assert "SFT only" in msg and "a template that keeps history" in msg
    with pytest.raises(ValueError, match="per_turn: the agent loop needs"):
        r.tool_response_ids(["42"], assistant_closed=True)


def test_a_template_that_keeps_history_samples_as_usual_under_per_turn(tokenizer):
    tok = with_family_tokens(tokenizer, FAMILIES["llama3"][0])
    r = ChatRenderer(tok, fmt="template", history="per_turn")
    assert r.divergence is None
    conv = sample_conversation()
    assert r.prompt_ids(conv[:1]) == ChatRenderer(tok, fmt="template").prompt_ids(conv[:1])
    (first, m1), (second, m2) = r.samples(conv)
    whole = r.render(conv)[0]
    assert whole[: len(second)] == second and first == second[: len(first)]  # prefixes of the whole stream
    assert sum(m1) == len(r.encode(r.assistant_body(conv[1]))) + 1


def test_a_hand_written_format_cuts_the_whole_conversation_at_each_turn(tokenizer):
    r = ChatRenderer(tokenizer, history="per_turn")
    conv = sample_conversation()
    (first, m1), (second, m2) = r.samples(conv)
    ids, mask = r.render(conv)
    assert second == ids[: len(second)] and first == ids[: len(first)]
    assert m1 == mask[: len(first)]  # the first turn trained as in the whole conversation
    assert m2[: len(first)] == [0] * len(first) and m2[len(first) :] == mask[len(first) : len(second)]
    assert r.samples(conv) != [r.render(conv)] and ChatRenderer(tokenizer).samples(conv) == [r.render(conv)]


def test_the_config_refuses_an_unknown_history_and_template_calls_in_a_hand_format():
    with pytest.raises(ValueError, match="unknown chat.history 'turns'; valid: exact, per_turn"):
        ChatConfig(history="turns")
    with pytest.raises(ValueError, match="chat.tool_format=template needs chat.format=template or auto"):
        ChatConfig(format="qwen3", tool_format="template")
