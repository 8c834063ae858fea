"""No tool call a model writes can end a rollout: a call the parser cannot read reaches the model as an error
text in the lock-step and the asynchronous agent loop, a parser that raises included (the loops' last guard), and
`tirl data sample` keeps such a turn as text."""

import copy
import dataclasses

import pytest

from tirl.eval.rejection_sampling import assistant_message
from tirl.rollout.agent.async_loop import AsyncAgentLoop
from tirl.rollout.agent.loop import AgentConfig, AgentLoop
from tirl.rollout.capabilities import EngineCapabilities
from tirl.rollout.engines.base import RemoteModel
from tirl.rollout.engines.torch.engine import Generation
from tirl.rollout.sampling import SamplingParams
from tirl.sandbox.types import ExecResult

HUGE_INTEGER_CALL = (
    '<tool_call>{"name":"code_interpreter","arguments":{"code":' + "7" * 5000 + "}}</tool_call>"
)  # the reproduction


class CallThenAnswer(RemoteModel):
    """First turn: `call`; once a tool response is in the context: a final answer."""

    capabilities = EngineCapabilities(
        name="fake", weight_sync="none", logprobs="renormalized", per_request_seeds=True, multi_process=False,
        batches_requests=True,
    )  # fmt: skip

    def __init__(self, renderer, call):
        self.r, self.call = renderer, call

    def generate(self, prompts, params, *, max_new_tokens=None, generator=None, seeds=None):
        out = []
        for ctx in prompts:
            if "<tool_response>" in self.r.tokenizer.decode(ctx):
                ids, reason = self.r.encode("The answer is \\boxed{42}.") + [self.r.eos_id], "eos"
            else:
                ids, reason = self.r.encode(self.call), "stop"
            out.append(Generation(ids, [-0.1] * len(ids), reason))
        return out


class NoSandbox:
    """Fails the test if anything would run: a call that cannot be read never reaches the sandbox."""

    def run_batch(self, codes, *, stdins=None, timeout_s=None) -> list[ExecResult]:
        raise AssertionError(f"ran {codes!r}")


def raising(renderer):
    """`renderer` whose tool format's parser raises on any turn (a format with a bug)."""

    def boom(text, schemas):
        raise RecursionError("maximum recursion depth exceeded")

    broken = copy.copy(renderer)
    broken.tool_format = dataclasses.replace(renderer.tool_format, parse_turn=boom)
    return broken


def rollout(loop_cls, renderer, call, **cfg):
    engine = CallThenAnswer(renderer, call)
    budget = {"max_response_tokens": 16_384, "max_tokens_per_turn": 8192}  # the huge integer: a token a digit
    loop = loop_cls(engine, renderer, NoSandbox(), AgentConfig(**budget, **cfg))
    [t] = loop.run([[{"role": "user", "content": "What is 6 * 7?"}]], SamplingParams())
    return t


@pytest.mark.parametrize("loop_cls", [AgentLoop, AsyncAgentLoop])
def test_a_call_with_a_huge_integer_gets_an_error_text(renderer, loop_cls):
    t = rollout(loop_cls, renderer, HUGE_INTEGER_CALL)
    assert t.stop_reason == "answer" and t.turns == 2
    [record] = t.tool_calls
    assert record.status == "parse_error" and "4300 digits" in record.response


@pytest.mark.parametrize("loop_cls", [AgentLoop, AsyncAgentLoop])
def test_a_parser_that_raises_gives_the_model_an_error_text(renderer, loop_cls):
    call = '<tool_call>\n{"name": "code_interpreter", "arguments": {"code": "print(1)"}}\n</tool_call>'
    t = rollout(loop_cls, raising(renderer), call)
    assert t.stop_reason == "answer" and t.turns == 2
    [record] = t.tool_calls
    assert record.status == "parse_error"
    assert record.response == "Error: the tool call could not be read (RecursionError)."


def test_a_parser_that_raises_ends_the_turn_as_an_answer_when_malformed_calls_are_dropped(renderer):
    t = rollout(AgentLoop, raising(renderer), "<tool_call>\n{}\n</tool_call>", malformed_calls="drop")
    assert t.stop_reason == "answer" and t.turns == 1 and t.tool_calls == []


def test_data_sample_keeps_a_turn_the_parser_raises_on_as_text(renderer):
    text = '<tool_call>\n{"name": "code_interpreter", "arguments": {"code": "print(1)"}}\n</tool_call>'
    assert assistant_message(text, raising(renderer)) == {"role": "assistant", "content": text}
