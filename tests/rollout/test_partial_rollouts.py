"""Partial rollouts and the request gate (`tirl.rollout.engines.gate`) on the OpenAI-compatible engine against a
scripted streaming server (httpx.MockTransport): a sync interrupts a request, which goes on from its tokens with
the new weights, each token keeping the version that sampled it; a sync without partial rollouts waits for the
request; a connection that dies mid-stream keeps its tokens and is retried from them."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from tirl.rollout.engines.openai.engine import EngineError, OpenAIEngine, OpenAIEngineConfig
from tirl.rollout.sampling import SamplingParams
from tirl.rollout.types import Generation, Trajectory
from tirl.train.rl.overlap import staleness_metrics

EOS, STOP = 2, 9


class SyncingEngine(OpenAIEngine):
    """The OpenAI engine with a sync that only bumps the version, under the gate as a server engine's does."""

    def sync_weights(self, model) -> None:
        with self.gate.exclusive():
            self.weight_version += 1


def _engine(handler, *, interrupt: bool, retries: int = 2) -> SyncingEngine:
    eng = SyncingEngine(
        OpenAIEngineConfig(urls=["http://a"], model="m", retries=retries, backoff_s=0.0, eos_ids=[EOS],
                           stop_ids=[STOP])
    )  # fmt: skip
    eng._client = httpx.Client(transport=httpx.MockTransport(handler))
    eng.gate.interrupt = interrupt
    return eng


def _chunk(token: int, lp: float, finish: str | None = None) -> bytes:
    choice = {"token_ids": [token], "logprobs": {"token_logprobs": [lp]}, "finish_reason": finish}
    return f"data: {json.dumps({'choices': [choice]})}\n\n".encode()


def _wait(cond, what: str) -> None:
    deadline = time.monotonic() + 10  # a guard against a hang, not a timing claim
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


def test_a_sync_interrupts_a_request_which_continues_from_its_tokens_with_the_new_weights():
    bodies, eng = [], None
    two_sent = threading.Event()

    def first():
        yield _chunk(10, -0.1)
        yield _chunk(11, -0.2)
        two_sent.set()
        _wait(lambda: eng.gate.closed, "the sync")
        yield _chunk(12, -0.3)  # the chunk in flight when the sync came: kept
        yield _chunk(13, -9.9)  # never read: the response is closed (vLLM aborts the request)

    def handler(req: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(req.content))
        if len(bodies) == 1:
            return httpx.Response(200, content=first())
        return httpx.Response(
            200, content=iter([_chunk(14, -0.4), _chunk(EOS, -0.5, "stop"), b"data: [DONE]\n\n"])
        )

    eng = _engine(handler, interrupt=True)
    out: list[Generation] = []
    worker = threading.Thread(
        target=lambda: out.extend(eng.generate([[1, 2]], SamplingParams(), max_new_tokens=6, seeds=[5]))
    )
    worker.start()
    assert two_sent.wait(10)
    eng.sync_weights(None)  # returns once the request has let go of the old weights
    worker.join(10)
    (g,) = out
    assert g.token_ids == [10, 11, 12, 14, EOS] and g.logprobs == [-0.1, -0.2, -0.3, -0.4, -0.5]
    assert g.token_versions == [0, 0, 0, 1, 1] and g.weight_version == 0 and g.finish_reason == "eos"
    assert bodies[0]["stream"] is True and bodies[0]["prompt"] == [1, 2] and bodies[0]["seed"] == 5
    # the continuation: the prefix with the kept tokens, the rest of the budget, a seed of its own
    assert (
        bodies[1]["prompt"] == [1, 2, 10, 11, 12] and bodies[1]["max_tokens"] == 3 and bodies[1]["seed"] == 8
    )
    assert eng.gate.interruptions == 1


def test_per_token_versions_reach_the_trajectory_and_its_record():
    g = Generation([10, 11, 12], [-0.1, -0.2, -0.3], "eos", 0, token_versions=[0, 0, 1])
    t = Trajectory([1], [], [], [])
    t.response_ids, t.loss_mask, t.logprobs = g.token_ids + [4, 4], [1, 1, 1, 0, 0], g.logprobs + [0.0, 0.0]
    t.token_versions, t.weight_versions, t.turn_texts = g.versions() + [-1, -1], [0], ["x"]
    t.check()
    assert t.spans_versions and t.turn_token_versions() == [0, 0, 0, -1, -1]
    back = Trajectory.from_dict(t.to_dict())
    assert back.token_versions == [0, 0, 1, -1, -1] and back.weight_versions == [0]
    t.token_versions = [0, 0, 0, -1, -1]  # one version per turn: the per-turn list says the same
    assert not t.spans_versions
    t.token_versions = [0, 0, 0, 0, -1]  # a version on a tool token
    with pytest.raises(ValueError, match="-1 exactly on tool tokens"):
        t.check()


def test_staleness_is_a_distribution_over_the_sampled_tokens():
    t = Trajectory([1], [5, 6, 4, 7, 8], [1, 1, 0, 1, 1], [0.0] * 5, turn_texts=["a", "b"])
    t.token_versions, t.weight_versions = [0, 0, -1, 1, 2], [0, 1]
    m = staleness_metrics([t], engine_version=2)  # ages 2, 2, 1, 0 (the tool token is not counted)
    assert m == {
        "rollout/staleness": 5 / 4,
        "rollout/staleness_max": 2.0,
        "rollout/staleness_share/0": 0.25,
        "rollout/staleness_share/1": 0.25,
        "rollout/staleness_share/2": 0.5,
    }


def test_without_partial_rollouts_a_sync_waits_for_the_request_in_flight():
    release, eng = threading.Event(), None

    def handler(req: httpx.Request) -> httpx.Response:
        _wait(lambda: eng.gate.closed, "the sync")
        release.wait(10)
        return httpx.Response(
            200, json={"choices": [{"token_ids": [10, EOS], "logprobs": {"token_logprobs": [-1.0, -2.0]}}]}
        )

    eng = _engine(handler, interrupt=False)
    out: list[Generation] = []
    worker = threading.Thread(
        target=lambda: out.extend(eng.generate([[1]], SamplingParams(), max_new_tokens=4))
    )
    worker.start()
    _wait(lambda: eng.gate.in_flight == 1, "the request")
    synced = threading.Event()
    syncer = threading.Thread(target=lambda: (eng.sync_weights(None), synced.set()))
    syncer.start()
    _wait(lambda: eng.gate.closed, "the sync")
    assert not synced.is_set() and eng.weight_version == 0  # the request holds the old weights
    release.set()
    worker.join(10)
    syncer.join(10)
    assert synced.is_set() and out[0].weight_version == 0 and out[0].token_versions is None
    assert eng.weight_version == 1


def test_a_stream_that_dies_keeps_its_tokens_and_is_retried_from_them():
    bodies = []

    def dies():
        yield _chunk(10, -0.1)
        yield _chunk(11, -0.2)
        raise httpx.ReadError("connection reset by peer")

    def handler(req: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(req.content))
        if len(bodies) == 1:
            return httpx.Response(200, content=dies())
        return httpx.Response(200, content=iter([_chunk(12, -0.3), _chunk(EOS, -0.4, "stop")]))

    (g,) = _engine(handler, interrupt=True).generate([[1]], SamplingParams(), max_new_tokens=8, seeds=[3])
    assert g.token_ids == [10, 11, 12, EOS] and g.token_versions == [
        0,
        0,
        0,
        0,
    ]  # nothing lost, nothing twice
    assert bodies[1]["prompt"] == [1, 10, 11] and bodies[1]["max_tokens"] == 6

    def always_dies(req: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused")

    with pytest.raises(EngineError, match="failed after 3 attempts: ConnectError"):
        _engine(always_dies, interrupt=True).generate([[1]], SamplingParams(), max_new_tokens=8, seeds=[3])


def test_a_server_that_is_gone_fails_the_partial_request_at_once_naming_why():
    """An engine that manages its server (vLLM) knows when the process has exited: no retries, its reason kept."""
    from tirl.rollout.engines.openai.engine import EngineGone

    calls = []

    class GoneEngine(SyncingEngine):
        def _stream_into(self, body, ids, lps, budget):
            calls.append(len(ids))
            raise EngineGone("the vLLM server (pid 7) exited with code -9; log server.log:\nKilled")

    eng = GoneEngine(
        OpenAIEngineConfig(urls=["http://a"], model="m", retries=3, backoff_s=0.0, eos_ids=[EOS])
    )
    eng.gate.interrupt = True
    with pytest.raises(EngineGone, match=r"(?s)exited with code -9.*Killed"):
        eng._one([1, 2], SamplingParams(), 8, seed=0)
    assert calls == [0]  # tried once, not retries + 1 times
