"""agent.token_stream and agent.malformed_calls in both modes, and `tirl check-tokens` on both token streams."""

import pytest
from test_agent import call, make_loop

from tirl.chat.tokcheck import check_rollout
from tirl.chat.tool_formats.hermes import parse_tool_calls
from tirl.rollout.agent.loop import AgentConfig, turn_calls
from tirl.rollout.sampling import SamplingParams

BROKEN = "<tool_call>\n{not json}\n</tool_call>"


def _tool_turn_text(renderer, t) -> str:
    first = t.loss_mask.index(0)  # the first tool-response token
    return renderer.tokenizer.decode(t.response_ids[first - 1 : first + 3], skip_special_tokens=False)


@pytest.mark.parametrize(
    ("stream", "join"), [("tirl", "<|im_end|>\n<|im_start|>user"), ("verl", "<|im_end|><|im_start|>user")]
)
def test_tool_turn_join(renderer, sandbox, stream, join):
    for stop in (True, False):  # the turn closed by the engine at </tool_call>, or by the model's own EOS
        loop, _, prompts = make_loop(
            renderer,
            sandbox,
            [[call("print(1)"), "\\boxed{1}"]],
            token_stream=stream,
            stop_at_tool_call_end=stop,
        )
        t = loop.run(prompts, SamplingParams())[0]
        text = renderer.tokenizer.decode(t.response_ids, skip_special_tokens=False)
        assert join in text and t.num_tool_calls == 1


@pytest.mark.parametrize("stream", ["tirl", "verl"])
def test_check_tokens_knows_both_streams(renderer, sandbox, stream):
    loop, _, prompts = make_loop(renderer, sandbox, [[call("print(1)"), "\\boxed{1}"]], token_stream=stream)
    t = loop.run(prompts, SamplingParams())[0].to_dict()
    other = "verl" if stream == "tirl" else "tirl"
    assert check_rollout(renderer, 1, prompts[0], t, stream=stream) == (None, 0)
    divergence, _ = check_rollout(renderer, 1, prompts[0], t, stream=other)
    assert divergence is not None and divergence.what == "ids"


def test_malformed_call_gets_feedback_by_default(renderer, sandbox):
    loop, _, prompts = make_loop(renderer, sandbox, [[BROKEN, "\\boxed{1}"]])
    t = loop.run(prompts, SamplingParams())[0]
    assert t.turns == 2 and t.num_tool_calls == 1 and "not valid JSON" in t.tool_calls[0].response


def test_malformed_call_dropped_ends_the_trajectory(renderer, sandbox):
    loop, _, prompts = make_loop(renderer, sandbox, [[BROKEN, "\\boxed{1}"]], malformed_calls="drop")
    t = loop.run(prompts, SamplingParams())[0]
    assert t.turns == 1 and t.num_tool_calls == 0 and t.stop_reason == "answer"
    assert set(t.loss_mask) == {1}  # nothing was appended after the sampled turn


def test_drop_keeps_the_valid_call_after_a_broken_one(renderer):
    text = BROKEN + "\n" + call("print(2)")
    feedback = turn_calls(text, renderer, AgentConfig())
    dropped = turn_calls(text, renderer, AgentConfig(malformed_calls="drop"))
    assert [c.error is not None for c in feedback] == [True]  # the first call of the turn, an error
    assert [c.arguments for c in dropped] == [{"code": "print(2)"}]
    unclosed = "<tool_call>\n" + '{"name": "code_interpreter", "arguments": {"code": "1"}}'
    assert parse_tool_calls(unclosed)[0].error is not None
    assert turn_calls(unclosed, renderer, AgentConfig(malformed_calls="drop")) == []
