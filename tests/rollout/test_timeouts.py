"""Time limits that grow with the token budget and the measured decode rate (tirl.rollout.timeouts): a long turn is
not killed by a limit sized for a short one."""

from __future__ import annotations

import httpx
import pytest

from tirl.commands.run_config import RolloutConfig
from tirl.rollout.engines.openai.engine import OpenAIEngine, OpenAIEngineConfig
from tirl.rollout.sampling import SamplingParams
from tirl.rollout.timeouts import Throughput

EOS = 2


def test_limit_is_the_base_plus_the_budget_at_the_floor_rate_until_a_slower_rate_is_measured():
    t = Throughput(5.0)
    assert t.limit(120.0, 20_000) == 120.0 + 20_000 / 5.0  # 4,120 s for a 20k-token turn, not 120 s
    t.observe(tokens=400, seconds=10.0)  # 40 tok/s: faster than the floor, so the floor still rules
    assert t.rate() == 5.0
    t.observe(tokens=8, seconds=100.0)  # too short to say anything about the decode rate
    assert t.rate() == 5.0
    t.observe(tokens=100, seconds=50.0)  # 2 tok/s: a loaded server; plan with half of it
    assert t.rate() == 1.0 and t.limit(10.0, 100) == 110.0
    with pytest.raises(ValueError, match="min_tokens_per_s must be > 0"):
        Throughput(0.0)


def test_each_request_gets_a_limit_from_its_own_budget():
    limits = []

    def handler(req: httpx.Request) -> httpx.Response:
        limits.append(req.extensions["timeout"]["read"])
        ids = list(range(10, 30))
        return httpx.Response(
            200, json={"choices": [{"token_ids": ids, "logprobs": {"token_logprobs": [-0.5] * len(ids)}}]}
        )

    eng = OpenAIEngine(
        OpenAIEngineConfig(urls=["http://a"], model="m", timeout_s=120.0, min_tokens_per_s=5.0, eos_ids=[EOS])
    )
    eng._client = httpx.Client(transport=httpx.MockTransport(handler))
    eng.generate([[1, 2]], SamplingParams(), max_new_tokens=20_000)
    eng.generate([[1, 2]], SamplingParams(), max_new_tokens=100)
    eng.close()
    assert limits == [pytest.approx(120.0 + 20_000 / 5.0), pytest.approx(120.0 + 100 / 5.0)]


def test_the_async_loops_watchdog_grows_with_the_response_budget():
    from tirl.rollout.agent.loop import AgentConfig
    from tirl.rollout.factory import agent_loop

    class _Server:
        capabilities = OpenAIEngine.capabilities

    ro = RolloutConfig(timeout_s=600.0, min_tokens_per_s=5.0)
    loop = agent_loop(ro, _Server(), None, None, AgentConfig(max_response_tokens=20_000))
    assert loop.timeout_s == pytest.approx(600.0 + 20_000 / 5.0)
    with pytest.raises(ValueError, match="min_tokens_per_s"):
        RolloutConfig(min_tokens_per_s=0.0)
