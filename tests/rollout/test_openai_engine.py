"""The OpenAI-compatible engine against a fake /v1/completions server (httpx.MockTransport): request shape,
token-in/token-out parsing, stop reasons, retries, round-robin, model checks and the RL refusal."""

from __future__ import annotations

import json

import httpx
import pytest

from tirl.commands.run_config import RolloutConfig, TirlConfig
from tirl.rollout.engines.openai.engine import EngineError, OpenAIEngine, OpenAIEngineConfig
from tirl.rollout.sampling import SamplingParams

EOS, STOP = 2, 9


def _engine(handler, urls=("http://a", "http://b"), retries=2) -> OpenAIEngine:
    eng = OpenAIEngine(
        OpenAIEngineConfig(urls=list(urls), model="m", retries=retries, backoff_s=0.0, concurrency=1,
                           eos_ids=[EOS], stop_ids=[STOP])
    )  # fmt: skip
    eng._client = httpx.Client(transport=httpx.MockTransport(handler))
    return eng


def _completion(ids, lps, finish="stop"):
    return {"choices": [{"token_ids": ids, "logprobs": {"token_logprobs": lps}, "finish_reason": finish}]}


def test_sends_ids_and_parses_ids_logprobs_and_stop_reasons():
    seen = []
    answers = [_completion([5, 6, STOP], [-0.1, -0.2, -0.3]), _completion([7, EOS], [-1.0, -2.0]),
               _completion([7, 8, 8], [-1.0, -2.0, -3.0], "length")]  # fmt: skip

    def handler(req: httpx.Request) -> httpx.Response:
        seen.append((req.url.host, json.loads(req.content)))
        return httpx.Response(200, json=answers[len(seen) - 1])

    eng = _engine(handler)
    gens = eng.generate(
        [[1, 3], [1, 4], [1]], SamplingParams(temperature=0.7), max_new_tokens=[8, 8, 3], seeds=[11, 12, 13]
    )
    assert [g.token_ids for g in gens] == [[5, 6, STOP], [7, EOS], [7, 8, 8]]
    assert gens[0].logprobs == [-0.1, -0.2, -0.3]
    assert [g.finish_reason for g in gens] == ["stop", "eos", "length"]
    assert [h for h, _ in seen] == ["a", "b", "a"]  # round-robin
    body = seen[0][1]
    assert body["prompt"] == [1, 3] and body["seed"] == 11 and body["max_tokens"] == 8
    assert body["return_token_ids"] is True and body["logprobs"] == 0
    assert body["stop_token_ids"] == [EOS, STOP] and body["temperature"] == 0.7


def test_a_reply_without_a_completion_is_an_engine_error_quoting_it():
    """A server shutting down (or aborting the request) answers 200 with an error object, as vLLM does: an
    EngineError that quotes it, not a KeyError naming 'choices'."""
    from tirl.rollout.engines.openai.engine import first_choice

    def handler(req: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"error": {"message": "engine is shutting down", "code": 500}})

    with pytest.raises(EngineError, match="answered without a completion: .*engine is shutting down"):
        _engine(handler, retries=0).generate([[1, 3]], SamplingParams(), max_new_tokens=4, seeds=[1])
    with pytest.raises(EngineError, match="streamed.*answered without a completion"):
        first_choice({"object": "error"}, "http://a/v1/completions (streamed)")
    for bad in ({"choices": []}, {"choices": ["x"]}, ["not", "a", "dict"]):
        with pytest.raises(EngineError):
            first_choice(bad, "w")
    assert first_choice(_completion([5], [-0.1]), "w")["token_ids"] == [5]


def test_retries_on_503_then_succeeds_and_gives_up_with_clear_error():
    calls = []

    def flaky(req):
        calls.append(1)
        return (
            httpx.Response(503, text="busy")
            if len(calls) < 3
            else httpx.Response(200, json=_completion([EOS], [0.0]))
        )

    assert _engine(flaky).generate([[1]], SamplingParams(), max_new_tokens=4)[0].token_ids == [EOS]
    assert len(calls) == 3

    def down(req):
        raise httpx.ConnectError("refused")

    with pytest.raises(EngineError, match="after 3 attempts.*ConnectError"):
        _engine(down).generate([[1]], SamplingParams(), max_new_tokens=4)


def test_text_only_server_is_refused():
    def text_only(req):
        return httpx.Response(200, json={"choices": [{"text": "hi", "finish_reason": "stop"}]})

    with pytest.raises(EngineError, match="without sampled token ids"):
        _engine(text_only).generate([[1]], SamplingParams(), max_new_tokens=4)


class _Tok:
    def encode(self, text, add_special_tokens=False):
        return [1, 2, 3]

    def decode(self, ids):
        return "abc"


def test_check_rejects_wrong_model_and_wrong_vocabulary():
    def handler(req):
        if req.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "other"}]})
        return httpx.Response(200, json={"prompt": "abc"})

    with pytest.raises(EngineError, match="not rollout.model_name='m'"):
        _engine(handler).check(_Tok())

    def wrong_vocab(req):
        if req.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "m"}]})
        assert req.url.path == "/detokenize" and json.loads(req.content)["tokens"] == [1, 2, 3]
        return httpx.Response(200, json={"prompt": "xyz"})

    with pytest.raises(EngineError, match="tokenizer disagrees"):
        _engine(wrong_vocab).check(_Tok())

    def ok(req):
        if req.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "m"}]})
        return httpx.Response(200, json={"prompt": "abc"})

    _engine(ok).check(_Tok())


def test_config_errors_and_rl_refusal(tmp_path):
    with pytest.raises(ValueError, match="unknown rollout.engine"):
        RolloutConfig(engine="sglang-magic")
    with pytest.raises(ValueError, match="needs rollout.urls"):
        RolloutConfig(engine="openai")
    with pytest.raises(EngineError, match="cannot send new weights"):
        _engine(lambda r: httpx.Response(200)).sync_weights(None)
    from tirl.commands.stages import run_rl

    cfg = TirlConfig(rollout=RolloutConfig(engine="openai", urls=["http://x"], model_name="m"))
    with pytest.raises(ValueError, match="cannot receive the policy's new weights"):
        run_rl(cfg, tmp_path)
