"""The agent loop with a scripted engine (exact turns) and with the real engine (invariants on sampled ids)."""

import pytest
import torch

from tirl.rollout.agent.loop import AgentConfig, AgentLoop
from tirl.rollout.engines.base import RemoteModel
from tirl.rollout.engines.torch.engine import Generation, TorchEngine
from tirl.rollout.sampling import SamplingParams
from tirl.tools.code_interpreter import tool_call_json


class ScriptedEngine(RemoteModel):
    """Answers each prompt with the next scripted turn of its conversation (found by its prompt prefix)."""

    def __init__(self, renderer, scripts, stop_at_call=True):
        self.renderer, self.scripts, self.stop_at_call = renderer, scripts, stop_at_call
        self.sampled: dict[int, list[int]] = {k: [] for k in range(len(scripts))}
        self.calls = 0

    def generate(self, prompts, params, *, max_new_tokens=None, generator=None):
        self.calls += 1
        out = []
        for ctx, limit in zip(prompts, max_new_tokens):
            k = next(i for i, s in enumerate(self.scripts) if list(ctx[: len(s["prompt"])]) == s["prompt"])
            text = self.scripts[k]["turns"].pop(0)
            ids = self.renderer.encode(text)
            reason = "stop" if ids and ids[-1] == self.renderer.tool_call_end_id else "eos"
            if ids[-1] != self.renderer.tool_call_end_id:
                ids = ids + [self.renderer.eos_id]
            if len(ids) > limit:
                ids, reason = ids[:limit], "length"
            self.sampled[k] += ids
            out.append(Generation(ids, [-0.5] * len(ids), reason))
        return out


def call(code):
    return f"Let me run it.\n<tool_call>\n{tool_call_json(code)}\n</tool_call>"


def make_loop(renderer, sandbox, turns_by_prompt, **cfg):
    prompts = [[{"role": "user", "content": f"question {i}"}] for i in range(len(turns_by_prompt))]
    scripts = [{"prompt": renderer.prompt_ids(p), "turns": list(t)} for p, t in zip(prompts, turns_by_prompt)]
    engine = ScriptedEngine(renderer, scripts)
    return AgentLoop(engine, renderer, sandbox, AgentConfig(**cfg)), engine, prompts


def test_tool_round_trip_and_masks(renderer, sandbox):
    loop, engine, prompts = make_loop(
        renderer,
        sandbox,
        [
            [call("print(6 * 7)"), "The answer is \\boxed{42}."],
            ["The answer is \\boxed{1}."],
        ],
    )
    trajs = loop.run(prompts, SamplingParams())
    t, u = trajs
    assert t.stop_reason == "answer" and t.turns == 2 and t.num_tool_calls == 1
    assert t.tool_calls[0].response == "42\n" and t.tool_calls[0].status == "ok"
    assert u.stop_reason == "answer" and u.turns == 1 and u.tool_calls == []
    assert engine.calls == 2  # the batch generates together: one call per turn
    for k, traj in enumerate(trajs):
        sampled = [i for i, m in zip(traj.response_ids, traj.loss_mask) if m]
        assert sampled == engine.sampled[k]  # ids in the trajectory are the ids sampled, mask 1 exactly there
        assert [lp for lp, m in zip(traj.logprobs, traj.loss_mask) if not m] == [0.0] * traj.loss_mask.count(
            0
        )
    tool_ids = [i for i, m in zip(t.response_ids, t.loss_mask) if not m]
    assert tool_ids == renderer.tool_response_ids(["42\n"], assistant_closed=False)
    # the whole trajectory is the conversation rendered at once (token-in/token-out, prefix-preserving)
    conv = prompts[0] + [
        {
            "role": "assistant",
            "content": "Let me run it.",
            "tool_calls": [{"function": {"name": "code_interpreter", "arguments": {"code": "print(6 * 7)"}}}],
        },
        {"role": "tool", "content": "42\n"},
        {"role": "assistant", "content": "The answer is \\boxed{42}."},
    ]
    whole, mask = renderer.render(conv)
    assert t.prompt_ids + t.response_ids == whole[:-1]  # the final "\n" after <|im_end|> is not generated
    # the appended <|im_end|> after </tool_call> was not sampled: mask 0 there, 1 in the SFT rendering
    assert sum(t.loss_mask) == sum(mask) - 1


def test_malformed_calls_get_errors_not_crashes(renderer, sandbox):
    bad = [
        "<tool_call>\n{not json}\n</tool_call>",
        '<tool_call>\n{"name": "web_search", "arguments": {"q": "x"}}\n</tool_call>',
        '<tool_call>\n{"name": "code_interpreter", "arguments": {}}\n</tool_call>',
    ]
    loop, _, prompts = make_loop(renderer, sandbox, [bad + ["\\boxed{0}"]])
    (t,) = loop.run(prompts, SamplingParams())
    assert t.stop_reason == "answer" and t.turns == 4
    assert [c.status for c in t.tool_calls] == ["parse_error"] * 3
    assert "not valid JSON" in t.tool_calls[0].response
    assert "unknown tool 'web_search'" in t.tool_calls[1].response
    assert "no 'code'" in t.tool_calls[2].response
    assert t.num_executed_calls == 0 and t.num_tool_errors == 3


def test_runtime_errors_and_truncation_reach_the_model(renderer, sandbox):
    loop, _, prompts = make_loop(
        renderer, sandbox, [[call("1/0"), call("print('x' * 1000)"), "done"]], max_tool_response_chars=64
    )
    (t,) = loop.run(prompts, SamplingParams())
    assert t.tool_calls[0].status == "runtime_error" and "division by zero" in t.tool_calls[0].response
    assert len(t.tool_calls[1].response) == 64 + len("...(truncated)...")


def test_max_turns(renderer, sandbox):
    loop, _, prompts = make_loop(renderer, sandbox, [[call("print(1)")] * 5], max_turns=3)
    (t,) = loop.run(prompts, SamplingParams())
    assert t.stop_reason == "max_turns" and t.turns == 3 and t.num_tool_calls == 2
    assert t.loss_mask[-1] == 1  # ends on model tokens


def test_budget_counts_tool_tokens(renderer, sandbox):
    loop, _, prompts = make_loop(
        renderer,
        sandbox,
        [[call("print('y' * 200)"), "unused"]],
        max_response_tokens=60,
        max_tokens_per_turn=60,
    )
    (t,) = loop.run(prompts, SamplingParams())
    assert t.stop_reason == "budget" and t.turns == 1
    assert (
        t.response_length <= 60 and t.loss_mask[-1] == 1
    )  # the tool result did not fit and was not appended
    # The call ran, but the model never saw its result: it must not earn the recipe's tool-call reward.
    assert t.num_tool_calls == 1 and t.tool_calls[0].status == "ok"
    assert t.tool_calls[0].result_seen is False and t.num_executed_calls == 0
    loop, _, prompts = make_loop(renderer, sandbox, [["x " * 100]], max_response_tokens=20)
    (t,) = loop.run(prompts, SamplingParams())
    assert t.stop_reason == "budget" and t.response_length == 20


def test_real_engine_invariants(model, tokenizer, renderer, sandbox):
    """With the real engine and an untrained model: masks, logprobs and ids line up in every trajectory."""
    engine = TorchEngine(model, eos_ids=[renderer.eos_id], pad_id=tokenizer.pad_token_id)
    loop = AgentLoop(engine, renderer, sandbox, AgentConfig(max_response_tokens=48, max_tokens_per_turn=16))
    engine.stop_ids = set(loop.stop_ids())
    prompts = [[{"role": "user", "content": f"What is {i} * 7?"}] for i in range(6)]
    trajs = loop.run(prompts, SamplingParams(), generator=torch.Generator().manual_seed(0))
    for t in trajs:
        t.check()
        assert t.stop_reason in ("answer", "budget", "turn_length", "max_turns")
        assert t.response_length <= 48 and set(t.loss_mask) <= {0, 1} and t.loss_mask[0] == 1
        assert all(lp < 0 for lp, m in zip(t.logprobs, t.loss_mask) if m)


def test_agent_config_validation():
    with pytest.raises(ValueError, match="max_turns"):
        AgentConfig(max_turns=0)
