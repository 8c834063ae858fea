"""The policy endpoint (tirl.rollout.gateway): an agent program on the official OpenAI client gets the engine's
samples, and its episode becomes trajectories built from the sampled ids, never from re-rendered text."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("openai")
from openai import OpenAI  # noqa: E402

from tirl.chat.template import ChatRenderer  # noqa: E402
from tirl.rollout.agent.config import AgentConfig, ProgramConfig  # noqa: E402
from tirl.rollout.engines.base import RemoteModel  # noqa: E402
from tirl.rollout.gateway.episode import Call, Episode, trajectories  # noqa: E402
from tirl.rollout.gateway.program import ProgramLoop  # noqa: E402
from tirl.rollout.gateway.server import Gateway, Served, app_of  # noqa: E402
from tirl.rollout.sampling import SamplingParams  # noqa: E402
from tirl.rollout.types import Generation  # noqa: E402
from tirl.tools.code_interpreter import CODE_INTERPRETER_SCHEMA, tool_call_json  # noqa: E402

AGENT = Path(__file__).resolve().parents[2] / "examples" / "openai_agent" / "agent.py"
QUESTION = [{"role": "user", "content": "What is 6 * 7?"}]


class ScriptedEngine(RemoteModel):
    """Samples the next scripted turn whatever the prompt; keeps every generation it returned."""

    def __init__(self, renderer: ChatRenderer, turns: list[str]) -> None:
        self.renderer, self.turns, self.returned = renderer, list(turns), []

    def generate(self, prompts, params, *, max_new_tokens=None, generator=None, seeds=None):
        out = []
        for _, limit in zip(prompts, max_new_tokens, strict=True):
            ids = self.renderer.encode(self.turns.pop(0))
            reason = "stop" if ids[-1] == self.renderer.tool_call_end_id else "eos"
            ids = ids if reason == "stop" else ids + [self.renderer.eos_id]
            ids, reason = (ids[:limit], "length") if len(ids) > limit else (ids, reason)
            g = Generation(ids, [-0.25 - 0.01 * k for k in range(len(ids))], reason)
            self.returned.append(g)
            out.append(g)
        return out


def call(code: str) -> str:
    return f"Let me run it.\n<tool_call>\n{tool_call_json(code)}\n</tool_call>"


@pytest.fixture()
def tool_renderer(tokenizer) -> ChatRenderer:
    return ChatRenderer(tokenizer, tools=[CODE_INTERPRETER_SCHEMA])


def served(engine, renderer, **program):
    gateway = Gateway(engine, renderer, AgentConfig(), ProgramConfig(**program))
    return gateway, Served(app_of(gateway), "127.0.0.1", 0)


def test_a_tool_round_trip_on_the_openai_client_is_tirls_own_token_stream(tool_renderer) -> None:
    r = tool_renderer
    engine = ScriptedEngine(r, [call("print(6 * 7)"), "The answer is \\boxed{42}."])
    gateway, server = served(engine, r)
    try:
        gateway.open("e1")
        client = OpenAI(base_url=f"{server.url}/episodes/e1/v1", api_key="tirl")
        messages = list(QUESTION)
        first = client.chat.completions.create(model="p", messages=messages, tools=[CODE_INTERPRETER_SCHEMA])
        msg = first.choices[0].message
        assert first.choices[0].finish_reason == "tool_calls" and msg.content == "Let me run it."
        assert msg.tool_calls[0].function.name == "code_interpreter"
        assert json.loads(msg.tool_calls[0].function.arguments) == {"code": "print(6 * 7)"}
        messages += [
            msg.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": "x", "content": "42\n"},
        ]
        second = client.chat.completions.create(model="p", messages=messages, tools=[CODE_INTERPRETER_SCHEMA])
        assert second.choices[0].message.content == "The answer is \\boxed{42}."
        assert second.usage.completion_tokens == len(engine.returned[1].token_ids)
    finally:
        server.stop()
    e = gateway.close("e1")
    assert [c.continues for c in e.calls] == [False, True] and e.divergences == 0
    (t,) = trajectories(e, [], on_divergence="refuse", training=True)
    g1, g2 = engine.returned
    tool = r.tool_response_ids(["42\n"], assistant_closed=False)
    assert t.prompt_ids == r.prompt_ids(QUESTION)  # the request's tools listed as tirl lists its own
    assert t.response_ids == g1.token_ids + tool + g2.token_ids
    assert t.loss_mask == [1] * len(g1.token_ids) + [0] * len(tool) + [1] * len(g2.token_ids)
    assert t.logprobs == g1.logprobs + [0.0] * len(tool) + g2.logprobs
    assert t.tool_calls[0].name == "code_interpreter" and t.tool_calls[0].response == "42\n"
    assert t.stop_reason == "answer" and t.graded_text == "The answer is \\boxed{42}.<|im_end|>"


def edited_episode(tool_renderer) -> tuple[Episode, ScriptedEngine]:
    engine = ScriptedEngine(tool_renderer, [call("print(6 * 7)"), "\\boxed{42}"])
    gateway, server = served(engine, tool_renderer)
    try:
        gateway.open("e2")
        client = OpenAI(base_url=f"{server.url}/episodes/e2/v1", api_key="tirl")
        messages = list(QUESTION)
        first = client.chat.completions.create(model="p", messages=messages, tools=[CODE_INTERPRETER_SCHEMA])
        edited = first.choices[0].message.model_dump(exclude_none=True) | {"content": "Let me   run it!"}
        messages += [edited, {"role": "tool", "tool_call_id": "x", "content": "42\n"}]
        client.chat.completions.create(model="p", messages=messages, tools=[CODE_INTERPRETER_SCHEMA])
    finally:
        server.stop()
    return gateway.close("e2"), engine


def test_an_edited_history_is_a_divergence_refused_or_split(tool_renderer) -> None:
    e, engine = edited_episode(tool_renderer)
    assert [c.continues for c in e.calls] == [False, False] and e.divergences == 1
    (refused,) = trajectories(e, [], on_divergence="refuse", training=True)
    assert refused.response_ids == [] and refused.stop_reason == "error" and "call 1" in refused.error
    split = trajectories(e, [], on_divergence="split", training=True)
    assert [t.response_ids for t in split] == [g.token_ids for g in engine.returned]
    assert all(t.graded_text == e.calls[-1].text for t in split)
    (last,) = trajectories(e, [], on_divergence="split", training=False)  # evaluation: one sample per episode
    assert last.response_ids == engine.returned[1].token_ids and last.prompt_ids == e.calls[1].prompt_ids


def test_completions_take_token_ids_and_continue_by_prefix(tool_renderer) -> None:
    r = tool_renderer
    engine = ScriptedEngine(r, ["Let me think.", "\\boxed{42}"])
    gateway, server = served(engine, r)
    try:
        gateway.open("e3")
        client = OpenAI(base_url=f"{server.url}/episodes/e3/v1", api_key="tirl")
        prompt = r.prompt_ids(QUESTION)
        one = client.completions.create(model="p", prompt=prompt, logprobs=1)
        assert one.choices[0].logprobs.token_logprobs == engine.returned[0].logprobs
        more = prompt + engine.returned[0].token_ids + r.encode("\nGo on.")
        client.completions.create(model="p", prompt=more)
    finally:
        server.stop()
    e = gateway.close("e3")
    (t,) = trajectories(e, [], on_divergence="refuse", training=True)
    assert t.loss_mask.count(0) == len(r.encode("\nGo on.")) and e.calls[1].continues


def test_requests_the_endpoint_refuses_say_why(tool_renderer) -> None:
    engine = ScriptedEngine(tool_renderer, ["a"] * 4)
    gateway, server = served(engine, tool_renderer, max_calls=1)
    import httpx

    try:
        gateway.open("e4")
        post = lambda path, body: httpx.post(f"{server.url}{path}", json=body, timeout=30)  # noqa: E731
        missing = post("/episodes/nope/v1/chat/completions", {"messages": QUESTION})
        assert missing.status_code == 404 and "no open episode 'nope'" in missing.json()["error"]["message"]
        bad = post("/episodes/e4/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]})
        assert bad.status_code == 400 and "role" in bad.json()["error"]["message"]
        assert post("/episodes/e4/v1/chat/completions", {"messages": QUESTION, "n": 2}).status_code == 400
        assert post("/episodes/e4/v1/chat/completions", {"messages": QUESTION}).status_code == 200
        capped = post("/episodes/e4/v1/chat/completions", {"messages": QUESTION})
        assert capped.status_code == 400 and capped.json()["error"]["code"] == "max_calls"
    finally:
        server.stop()
    assert len(gateway.close("e4").calls) == 1


def program_loop(renderer, engine, sandbox, **program) -> ProgramLoop:
    cfg = AgentConfig(program=ProgramConfig(command=f"{sys.executable} {AGENT}", **program))
    return ProgramLoop(engine, renderer, sandbox, cfg, cfg.program)


def test_a_program_per_episode_graded_on_its_printed_answer(tool_renderer, sandbox) -> None:
    from tirl.data.records import ProblemRow
    from tirl.rollout.types import Origin

    engine = ScriptedEngine(tool_renderer, [call("print(6 * 7)"), "The answer is \\boxed{42}."])
    loop = program_loop(tool_renderer, engine, sandbox, concurrency=1)
    try:
        row = ProblemRow("p0", "arith", list(QUESTION), "42")
        (t,) = loop.run([QUESTION], SamplingParams(), origins=[Origin(row, group=0)])
    finally:
        loop.close()
    assert t.error is None and t.stop_reason == "answer" and t.graded_text == "The answer is \\boxed{42}."
    assert t.response_ids[-len(engine.returned[1].token_ids) :] == engine.returned[1].token_ids
    assert t.tool_calls[0].response == "42\n"  # what the program's own tool printed
    assert loop.episode_metrics()["agent/episodes"] == 1 and loop.episode_metrics()["agent/divergent"] == 0


@pytest.mark.parametrize(
    "source, status, said",
    [
        ("import sys; sys.stderr.write('boom'); sys.exit(3)", "crashed", "exit code 3: boom"),
        ("import time; time.sleep(60)", "timeout", "agent.program.timeout_s=2"),
        ("print('42')", "no_calls", "never called the model"),
    ],
)
def test_a_program_that_fails_trains_nothing_and_says_why(
    tool_renderer, sandbox, tmp_path, source, status, said
):
    (tmp_path / "p.py").write_text(source)
    engine = ScriptedEngine(tool_renderer, [])
    cfg = AgentConfig(program=ProgramConfig(command=f"{sys.executable} {tmp_path / 'p.py'}", timeout_s=2))
    loop = ProgramLoop(engine, tool_renderer, sandbox, cfg, cfg.program)
    try:
        (t,) = loop.run([QUESTION], SamplingParams())
    finally:
        loop.close()
    assert (
        t.response_ids == [] and t.stop_reason == "error" and t.error.startswith(status) and said in t.error
    )
    assert loop.episode_metrics()[f"agent/{status}"] == 1


def test_trajectories_of_a_call_chain_are_pure() -> None:
    calls = [
        Call([1, 2], [3, 4], [-1.0, -2.0], "stop", 0, "ab", False, [("f", {})]),
        Call([1, 2, 3, 4, 9], [5], [-3.0], "eos", 1, "c", True),
    ]
    calls[0].tool_results = ["out"]
    (t,) = trajectories(Episode("e", calls=calls), [], on_divergence="refuse", training=True)
    assert (t.prompt_ids, t.response_ids, t.loss_mask) == ([1, 2], [3, 4, 9, 5], [1, 1, 0, 1])
    assert t.token_versions == [0, 0, -1, 1] and t.weight_versions == [0, 1]
    budget = Episode("e", calls=calls, status="budget")
    assert trajectories(budget, [], on_divergence="refuse", training=True)[0].stop_reason == "budget"


def test_serve_policy_serves_a_saved_model_and_writes_its_episodes_on_sigterm(tokenizer, tmp_path) -> None:
    import os
    import re
    import signal
    import subprocess

    from conftest import make_model

    make_model(tokenizer).save_pretrained(tmp_path / "m")
    tokenizer.save_pretrained(tmp_path / "m")
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "tirl", "serve-policy", f"model.path={tmp_path / 'm'}", "sandbox.isolation=none",
           "agent.max_tokens_per_turn=8", "--port", "0", "--out", str(out)]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=os.environ)
    try:
        line = proc.stdout.readline()
        url = re.search(r"(http://\S+)/v1 ", line)
        assert url, line + proc.stderr.read() if proc.poll() is not None else line
        client = OpenAI(base_url=f"{url.group(1)}/v1", api_key="x", default_headers={"X-Episode-Id": "mine"})
        reply = client.chat.completions.create(model="p", messages=QUESTION)
        assert reply.usage.completion_tokens >= 1 and reply.model == "tirl-policy"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        proc.kill()
        proc.wait()
    (episode,) = [json.loads(ln) for ln in (out / "episodes.jsonl").read_text().splitlines()]
    assert episode["episode"] == "mine" and episode["calls"] == 1
    (t,) = episode["trajectories"]
    assert len(t["response_ids"]) == reply.usage.completion_tokens and set(t["loss_mask"]) == {1}


def test_worker_mode_reuses_its_processes_and_replaces_a_failed_one(tool_renderer, sandbox, tmp_path) -> None:
    engine = ScriptedEngine(tool_renderer, ["The answer is \\boxed{42}."] * 8)
    loop = program_loop(tool_renderer, engine, sandbox, mode="worker", concurrency=2, timeout_s=30)
    try:
        first = loop.run([QUESTION] * 3, SamplingParams())
        pids = sorted(w.proc.pid for w in list(loop.idle.queue))
        second = loop.run([QUESTION] * 2, SamplingParams())
        assert sorted(w.proc.pid for w in list(loop.idle.queue)) == pids  # the same two processes
    finally:
        loop.close()
    assert all(t.error is None and t.graded_text == "The answer is \\boxed{42}." for t in first + second)
    assert all(w.proc is None for w in list(loop.idle.queue))  # closed: killed
    # a worker that dies on one episode, and one that stops answering on another
    (tmp_path / "w.py").write_text(
        "import json, sys, time\n"
        "for line in sys.stdin:\n"
        "    e = json.loads(line)\n"
        "    said = e['messages'][0]['content']\n"
        "    if said == 'crash': sys.stderr.write('gone'); sys.exit(4)\n"
        "    if said == 'hang': time.sleep(60)\n"
        "    print('a log line'); print(json.dumps({'episode': e['episode'], 'answer': 'x'}), flush=True)\n"
    )
    cfg = AgentConfig(program=ProgramConfig(command=f"{sys.executable} {tmp_path / 'w.py'}", mode="worker",
                                            concurrency=1, timeout_s=2))  # fmt: skip
    loop = ProgramLoop(engine, tool_renderer, sandbox, cfg, cfg.program)
    said = ["ok", "crash", "ok", "hang", "ok"]
    try:
        trajs = loop.run([[{"role": "user", "content": s}] for s in said], SamplingParams())
    finally:
        loop.close()
    errors = [t.error for t in trajs]
    assert errors[1].startswith("crashed") and "code 4: gone" in errors[1]
    assert errors[3].startswith("timeout") and "agent.program.timeout_s=2" in errors[3]
    # the others answered (without asking the model), each time from a worker that was alive or replaced
    assert all(errors[i].startswith("no_calls") and trajs[i].graded_text == "x" for i in (0, 2, 4))


def test_a_reported_score_is_the_reward_and_a_missing_one_trains_nothing(tool_renderer, sandbox, tmp_path):
    from tirl.data.records import ProblemRow
    from tirl.rewards.shaping import RewardConfig
    from tirl.rollout.agent.episodes import rollout_and_score

    (tmp_path / "p.py").write_text(
        "import json, sys\n"
        "from openai import OpenAI\n"
        "e = json.loads(sys.stdin.read())\n"
        "said = e['messages'][0]['content']\n"
        "text = OpenAI().chat.completions.create(model='p', messages=e['messages']).choices[0].message.content\n"
        "print(json.dumps({'answer': text, **({} if said == 'mute' else {'score': 0.75})}))\n"
    )
    engine = ScriptedEngine(tool_renderer, ["\\boxed{42}", "\\boxed{42}"])
    cfg = AgentConfig(program=ProgramConfig(command=f"{sys.executable} {tmp_path / 'p.py'}", reward="program",
                                            concurrency=1))  # fmt: skip
    loop = ProgramLoop(engine, tool_renderer, sandbox, cfg, cfg.program)
    rows = [
        ProblemRow(f"p{i}", "math", [{"role": "user", "content": c}], "42")
        for i, c in enumerate(["q", "mute"])
    ]
    try:
        trajs, scores = rollout_and_score(loop, rows, SamplingParams(), n=1, reward=RewardConfig(), generator=None,
                                          where="test", first_group=0)  # fmt: skip
    finally:
        loop.close()
    reported, mute = zip(trajs, scores, strict=True)
    assert reported[1].reward == 0.75 and reported[1].correct  # the program's reward; the verifier's verdict
    assert reported[0].outcome.score == 0.75 and reported[0].to_dict()["meta"]["reported_score"] == 0.75
    assert mute[0].response_ids == [] and mute[0].error.startswith("no_score")
    assert loop.episode_metrics()["agent/no_score"] == 1


def test_a_request_that_breaks_the_engine_fails_only_its_own_episode(tool_renderer) -> None:
    import concurrent.futures

    from tirl.rollout.gateway.server import Batcher

    class Picky(ScriptedEngine):
        def generate(self, prompts, params, **kw):
            if any(7 in p for p in prompts):
                raise RuntimeError("the engine cannot take id 7")
            return super().generate(prompts, params, **kw)

    batcher = Batcher(Picky(tool_renderer, ["fine"]))
    good, bad = concurrent.futures.Future(), concurrent.futures.Future()
    batcher._generate([([1, 2], 4, good), ([7], 4, bad)])  # one batch: it fails, then each runs alone
    assert good.result(timeout=5).token_ids and "id 7" in str(bad.exception(timeout=5))


def test_ids_outside_the_vocabulary_and_oversized_requests_are_refused(tool_renderer) -> None:
    import httpx

    from tirl.rollout.gateway.server import MAX_REQUEST_CHARS

    gateway, server = served(ScriptedEngine(tool_renderer, ["a"]), tool_renderer)
    try:
        gateway.open("e5")
        post = lambda path, body: httpx.post(f"{server.url}{path}", json=body, timeout=30)  # noqa: E731
        vocab = len(tool_renderer.tokenizer)
        outside = post("/episodes/e5/v1/completions", {"prompt": [1, vocab]})
        assert outside.status_code == 400 and f"[0, {vocab})" in outside.json()["error"]["message"]
        huge = [{"role": "user", "content": "x" * (MAX_REQUEST_CHARS + 1)}]
        big = post("/episodes/e5/v1/chat/completions", {"messages": huge})
        assert big.status_code == 400 and big.json()["error"]["code"] == "request_too_large"
    finally:
        server.stop()
    assert gateway.close("e5").calls == []
