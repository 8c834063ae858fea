from conftest import sample_conversation
from tirl.chat.template import IM_END, conversation_text


def test_jinja_template_renders_the_same_text(tokenizer, renderer):
    conv = sample_conversation()
    ids, _ = renderer.render(conv)
    assert tokenizer.decode(ids) == tokenizer.apply_chat_template(conv, tokenize=False)
    prompt = renderer.prompt_ids(conv[:1])
    assert tokenizer.decode(prompt) == tokenizer.apply_chat_template(
        conv[:1], tokenize=False, add_generation_prompt=True
    )


def test_layout_matches_qwen_hermes():
    text = conversation_text(sample_conversation())
    assert text == (
        "<|im_start|>user\nWhat is 12 * 34?<|im_end|>\n"
        "<|im_start|>assistant\nI will compute it with Python.\n<tool_call>\n"
        '{"name": "code_interpreter", "arguments": {"code": "print(12 * 34)"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n408\n\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\nThe answer is \\boxed{408}.<|im_end|>\n"
    )


def test_loss_mask_covers_assistant_tokens_only(tokenizer, renderer):
    conv = sample_conversation()
    ids, mask = renderer.render(conv)
    trained = tokenizer.decode([i for i, m in zip(ids, mask) if m])
    assert trained == (
        "I will compute it with Python.\n<tool_call>\n"
        '{"name": "code_interpreter", "arguments": {"code": "print(12 * 34)"}}\n</tool_call><|im_end|>'
        "The answer is \\boxed{408}.<|im_end|>"
    )
    assert "408\n\n</tool_response>" not in trained  # the tool output is never trained on


def test_turn_by_turn_equals_whole(renderer):
    """Prompt + sampled turn + tool response + sampled turn == the whole conversation (prefix-preserving)."""
    conv = sample_conversation()
    whole, _ = renderer.render(conv)
    ids = renderer.prompt_ids(conv[:1])
    turn1 = renderer.encode(
        "I will compute it with Python.\n<tool_call>\n"
        '{"name": "code_interpreter", "arguments": {"code": "print(12 * 34)"}}\n</tool_call>'
    )
    ids += turn1 + renderer.tool_response_ids(["408\n"], assistant_closed=False)
    ids += renderer.encode("The answer is \\boxed{408}.") + renderer.encode(IM_END) + renderer.encode("\n")
    assert ids == whole


def test_consecutive_tool_messages_share_a_user_turn():
    conv = sample_conversation()
    conv.insert(3, {"role": "tool", "content": "second"})
    text = conversation_text(conv)
    assert "</tool_response>\n<tool_response>\nsecond\n</tool_response><|im_end|>" in text
    assert text.count("<|im_start|>user") == 2


def test_bad_roles_raise(renderer):
    import pytest

    with pytest.raises(ValueError, match="unknown role 'robot'"):
        renderer.render([{"role": "robot", "content": "x"}])
    with pytest.raises(ValueError, match="only allowed first"):
        renderer.render([{"role": "user", "content": "x"}, {"role": "system", "content": "y"}])


def test_tokenizer_without_chatml_is_refused():
    import pytest
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from tirl.chat.template import ChatRenderer

    tok = Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")
    with pytest.raises(ValueError, match="no <\\|im_end\\|> token"):
        ChatRenderer(fast)


def test_pad_falls_back_to_end_of_turn(tokenizer):
    import copy

    from tirl.chat.template import ChatRenderer

    no_pad = copy.deepcopy(tokenizer)
    no_pad.pad_token = None
    r = ChatRenderer(no_pad)
    assert r.pad_id == r.eos_id and ChatRenderer(tokenizer).pad_id == tokenizer.pad_token_id


def test_a_format_that_does_not_match_the_models_template_is_named():
    from tirl.chat.template import CHATML_JINJA, format_mismatch

    qwen_template = "{{- '<tools>' }}{%- for tool in tools %}...{%- endfor %}"
    assert "needs chat.format=chatml" in format_mismatch("qwen3", chat_template=CHATML_JINJA)
    assert format_mismatch("chatml", chat_template=CHATML_JINJA) is None
    assert "the Qwen formats (qwen2.5, qwen3) match it" in format_mismatch(
        "chatml", chat_template=qwen_template
    )
    assert format_mismatch("qwen2.5", chat_template=qwen_template) is None
    # no template: the model type decides (tirl plan reads only config.json)
    assert "a llama model is not Qwen's" in format_mismatch("qwen3", model_type="llama")
    assert "a qwen3 model is Qwen's" in format_mismatch("chatml", model_type="qwen3")
    assert format_mismatch("qwen3", model_type="qwen3") is None and format_mismatch("qwen3") is None
