"""The asynchronous agent loop: same trajectories as lock-step, overlap of slow tool calls, timeouts, check-tokens."""

import json
import threading
import time

import torch

from tirl.chat.tokcheck import check_rollout
from tirl.data import write_rows
from tirl.data.records import ProblemRow
from tirl.rollout.agent.async_loop import AsyncAgentLoop
from tirl.rollout.agent.loop import AgentConfig, AgentLoop
from tirl.rollout.capabilities import EngineCapabilities
from tirl.rollout.engines.base import RemoteModel
from tirl.rollout.engines.torch.engine import Generation, TorchEngine
from tirl.rollout.sampling import SamplingParams
from tirl.rollout.types import Origin
from tirl.sandbox.types import ExecResult
from tirl.tools.code_interpreter import tool_call_json


class ToolThenAnswer(RemoteModel):
    """Thread-safe fake server: the first turn calls the tool (code from the question), the next one answers.
    A question containing "hang" blocks on its second turn until `release` is set."""

    capabilities = EngineCapabilities(
        name="fake", weight_sync="none", logprobs="renormalized", per_request_seeds=True, multi_process=False,
        batches_requests=True,
    )  # fmt: skip

    def __init__(self, renderer, latency=0.0):
        self.r, self.latency, self.release = renderer, latency, threading.Event()

    def generate(self, prompts, params, *, max_new_tokens=None, generator=None, seeds=None):
        out = []
        for ctx, limit in zip(prompts, max_new_tokens):
            text = self.r.tokenizer.decode(ctx)
            time.sleep(self.latency)
            if "<tool_response>" in text:
                if "hang" in text:
                    self.release.wait()
                ids = self.r.encode("The answer is \\boxed{42}.") + [self.r.eos_id]
            else:
                code = "slow()" if "slow" in text else "print(6 * 7)"
                ids = self.r.encode(f"Let me run it.\n<tool_call>\n{tool_call_json(code)}\n</tool_call>")
            ids = ids[:limit]
            reason = "eos" if ids[-1] == self.r.eos_id else "stop"
            out.append(Generation(ids, [-0.1] * len(ids), reason))
        return out


class SlowSandbox:
    """Returns "42" for every snippet; a snippet calling slow() takes `delay` seconds."""

    def __init__(self, delay):
        self.delay, self.calls = delay, 0

    def run_batch(self, codes, *, stdins=None, timeout_s=None):
        self.calls += len(codes)
        if any("slow()" in c for c in codes):
            time.sleep(self.delay)
        return [ExecResult("42\n", "", 0, False, False, 0.0) for _ in codes]


def prompts(questions):
    return [[{"role": "user", "content": q}] for q in questions]


def test_same_trajectories_as_lockstep(renderer):
    ps = prompts(["What is 6 * 7?", "slow: 6 * 7?", "And 42?"])
    origins = [Origin(ProblemRow(str(k), "test", p, "42"), sample=0) for k, p in enumerate(ps)]
    a = AgentLoop(ToolThenAnswer(renderer), renderer, SlowSandbox(0.0), AgentConfig()).run(
        ps, SamplingParams(), origins=origins
    )
    b = AsyncAgentLoop(
        ToolThenAnswer(renderer), renderer, SlowSandbox(0.0), AgentConfig(), concurrency=2
    ).run(ps, SamplingParams(), origins=origins)
    assert [t.to_dict() for t in a] == [t.to_dict() for t in b]
    assert all(t.stop_reason == "answer" and t.num_executed_calls == 1 for t in b)


def test_slow_tool_calls_overlap(renderer):
    """8 trajectories whose tool calls each sleep 0.4 s: serially 3.2 s, overlapped about one call's time."""
    sb = SlowSandbox(0.4)
    loop = AsyncAgentLoop(ToolThenAnswer(renderer, latency=0.01), renderer, sb, AgentConfig(), concurrency=8)
    t0 = time.monotonic()
    trajs = loop.run(prompts([f"slow {k}" for k in range(8)]), SamplingParams())
    wall = time.monotonic() - t0
    assert sb.calls == 8 and all(t.stop_reason == "answer" for t in trajs)
    assert wall < 0.4 * 8 / 3  # far below the serial sum (3.2 s) even on a loaded 2-core machine


def test_concurrency_bounds_the_overlap(renderer):
    loop = AsyncAgentLoop(ToolThenAnswer(renderer), renderer, SlowSandbox(0.2), AgentConfig(), concurrency=1)
    t0 = time.monotonic()
    loop.run(prompts(["slow a", "slow b", "slow c"]), SamplingParams())
    assert time.monotonic() - t0 >= 3 * 0.2  # one slot: the calls run one after another


def test_hanging_request_becomes_error_trajectory(renderer):
    engine = ToolThenAnswer(renderer)
    loop = AsyncAgentLoop(engine, renderer, SlowSandbox(0.0), AgentConfig(), concurrency=1, timeout_s=0.5)
    ps = prompts(["hang here", "What is 6 * 7?", "And 42?"])
    try:
        t0 = time.monotonic()
        trajs = loop.run(ps, SamplingParams())
        assert time.monotonic() - t0 < 5  # the other two ran in a replacement slot
    finally:
        engine.release.set()
    hung, ok, ok2 = trajs
    assert hung.stop_reason == "error" and "timed out" in hung.error
    assert ok.stop_reason == ok2.stop_reason == "answer"
    # cut back to its model turn: the tool response it never answered is dropped, as the budget rule does
    assert hung.turns == 1 and hung.loss_mask == [1] * hung.response_length
    assert hung.tool_calls[0].result_seen is False and hung.num_executed_calls == 0
    for k, t in enumerate(trajs):
        assert check_rollout(renderer, k, ps[k], t.to_dict()) == (None, 0)


def test_torch_engine_trajectories_pass_check_tokens(renderer, model, sandbox):
    engine = TorchEngine(model, eos_ids=[renderer.eos_id], pad_id=renderer.pad_id)
    cfg = AgentConfig(max_response_tokens=48, max_tokens_per_turn=24)
    loop = AsyncAgentLoop(engine, renderer, sandbox, cfg, concurrency=3)
    ps = prompts([f"What is {k} + 1?" for k in range(6)])
    trajs = loop.run(ps, SamplingParams(temperature=1.0), generator=torch.Generator().manual_seed(0))
    again = loop.run(ps, SamplingParams(temperature=1.0), generator=torch.Generator().manual_seed(0))
    assert [t.response_ids for t in trajs] == [t.response_ids for t in again]  # per-trajectory seeds
    for t in trajs:
        assert t.response_length <= 48 and t.stop_reason in ("answer", "budget", "turn_length", "max_turns")
        assert t.loss_mask[-1] == 1 and len(t.logprobs) == t.response_length
    # (check-tokens on an untrained model's byte soup trips over partial UTF-8 tokens in either loop: the CLI test
    # below runs it on the async loop's trajectories of readable turns)


def test_check_tokens_cli_passes_on_async_trajectories(renderer, tokenizer, tmp_path, capsys):
    from tirl.cli import main
    from tirl.eval.evaluate import EvalConfig, evaluate, write_eval

    tokenizer.save_pretrained(tmp_path / "tok")
    loop = AsyncAgentLoop(ToolThenAnswer(renderer), renderer, SlowSandbox(0.0), AgentConfig(), concurrency=3)
    rows = [
        {"data_source": "tirl/arith", "prompt": [{"role": "user", "content": f"What is 6 * {k}?"}],
         "reward_model": {"ground_truth": "42"}, "extra_info": {"id": f"p{k}"}}
        for k in (7, 8)
    ]  # fmt: skip
    _, trajs = evaluate(loop, rows, EvalConfig(n=2), model_label="scripted", seed=0)
    write_eval(tmp_path / "eval", [], trajs, {})
    path = tmp_path / "eval" / "trajectories.jsonl"
    assert main(["check-tokens", str(path), "--model", str(tmp_path / "tok"), "--strict"]) == 0
    assert "4 rows checked, 0 diverge" in capsys.readouterr().out
    # without the stored prompt, --data finds it by the problem id eval records carry
    bare = [json.loads(line) for line in path.read_text().splitlines()]
    for t in bare:
        del t["meta"]["prompt"]
    path.write_text("".join(json.dumps(t) + "\n" for t in bare))
    data = str(write_rows(tmp_path / "rows.jsonl", rows))
    assert (
        main(["check-tokens", str(path), "--model", str(tmp_path / "tok"), "--strict", "--data", data]) == 0
    )
    assert "4 rows checked, 0 diverge" in capsys.readouterr().out


def test_rollout_mode_picks_the_loop(tokenizer, model, sandbox):
    import pytest

    from tirl.commands.run_config import RolloutConfig, TirlConfig
    from tirl.commands.stages import build_agent

    cfg = TirlConfig()
    assert type(build_agent(model, tokenizer, cfg, sandbox)) is AgentLoop  # auto + torch engine: lock-step
    cfg.rollout = RolloutConfig(mode="async", concurrency=4, timeout_s=30)
    agent = build_agent(model, tokenizer, cfg, sandbox)
    budget_s = cfg.agent.max_response_tokens / cfg.rollout.min_tokens_per_s  # the watchdog grows with it
    assert isinstance(agent, AsyncAgentLoop) and agent.concurrency == 4 and agent.timeout_s == 30 + budget_s
    with pytest.raises(ValueError, match="rollout.mode"):
        RolloutConfig(mode="fast")


def test_cli_eval_runs_the_async_loop(tokenizer, model, tmp_path, monkeypatch):
    """`tirl eval rollout.mode=async` end to end on a saved tiny model: trajectories written, none timed out."""
    import json

    from tirl.cli import main

    model.save_pretrained(tmp_path / "m")
    tokenizer.save_pretrained(tmp_path / "m")
    rows = tmp_path / "rows.jsonl"
    rows.write_text(
        "".join(
            json.dumps({"data_source": "tirl/arith", "prompt": [{"role": "user", "content": f"What is {k} + 1?"}],
                        "reward_model": {"ground_truth": str(k + 1)}, "extra_info": {"id": f"p{k}"}}) + "\n"
            for k in range(3)
        )
    )  # fmt: skip
    args = [f"eval.data={rows}", f"model.path={tmp_path / 'm'}", f"out_dir={tmp_path / 'out'}", "eval.n=2"]
    args += ["rollout.mode=async", "rollout.concurrency=3", "agent.max_response_tokens=16"]
    runs = []
    original = AsyncAgentLoop.run
    monkeypatch.setattr(
        AsyncAgentLoop, "run", lambda self, *a, **k: runs.append(1) or original(self, *a, **k)
    )
    assert main(["eval", *args]) == 0
    assert runs  # the async loop did the rollouts
    written = list((tmp_path / "out").rglob("trajectories.jsonl"))
    trajs = [json.loads(line) for line in written[0].read_text().splitlines()]
    assert len(trajs) == 6 and all(t["stop_reason"] != "error" for t in trajs)
