"""Streaming RL (`rl.stream.*`, tirl.train.rl.stream): K = 0 is the synchronous loop to the bit, old groups are dropped
and counted, the buffer stays bounded, a failed group and a kill-and-resume lose and repeat nothing.

The trainer tests sample with the async agent loop from `ServerLike`: the in-process torch engine on its own copy of
the policy, behind the request gate a server engine has (a sync waits for the requests in flight), one seeded
generator per request as a server's seeds: fast, deterministic, and shaped like vLLM for the trainer.
"""

from __future__ import annotations

import contextlib
import copy
import threading
import time

import pytest
import torch

from conftest import make_model, rl_trainer
from tirl.data.records import ProblemRow
from tirl.rewards.shaping import RewardConfig
from tirl.rollout.agent.async_loop import AsyncAgentLoop
from tirl.rollout.agent.loop import AgentConfig
from tirl.rollout.capabilities import EngineCapabilities
from tirl.rollout.config import RolloutConfig
from tirl.rollout.engines.gate import RequestGate
from tirl.rollout.engines.torch.engine import TorchEngine
from tirl.rollout.factory import capabilities_for
from tirl.rollout.sampling import SamplingParams
from tirl.rollout.types import Trajectory
from tirl.train import checkpoint, checkpoint_read
from tirl.train.optim import OptimConfig
from tirl.train.rl.check import check_engine, check_rl
from tirl.train.rl.config import StreamConfig
from tirl.train.rl.stream import FinishedGroup, GroupFailed, GroupWork, StreamProducer
from tirl.train.rl.trainer import RLConfig, RLTrainer

VOLATILE = ("time/", "perf/", "memory/", "stream/", "rollout/staleness")


class ServerLike(TorchEngine):
    """The torch engine on its own copy of the policy, which a sync overwrites, behind a request gate."""

    capabilities = EngineCapabilities(
        name="server-like",
        weight_sync="memory",
        logprobs="full",
        per_request_seeds=False,
        multi_process=False,
        batches_requests=True,
        sync_gate=True,
    )

    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self.gate = RequestGate()

    def generate(self, *a, **kw):
        with self.gate.request():
            return super().generate(*a, **kw)

    def sync_weights(self, model: torch.nn.Module) -> None:
        with self.gate.exclusive(), torch.no_grad():
            for dst, src in zip(self.model.parameters(), model.parameters(), strict=True):
                dst.copy_(src)
            self.weight_version += 1


def _rows() -> list[dict]:
    return [
        {
            "prompt": [{"role": "user", "content": f"What is {a} * 3?"}],
            "reward_model": {"ground_truth": str(3 * a)},
        }
        for a in range(2, 8)
    ]


def _trainer(tokenizer, renderer, sandbox, out, *, stream: StreamConfig, steps: int = 2) -> RLTrainer:
    torch.manual_seed(0)
    model = make_model(tokenizer)
    engine = ServerLike(copy.deepcopy(model), eos_ids=[renderer.eos_id], pad_id=renderer.pad_id)
    agent = AsyncAgentLoop(
        engine, renderer, sandbox, AgentConfig(max_response_tokens=12, max_tokens_per_turn=12), concurrency=8
    )
    cfg = RLConfig(
        steps=steps,
        prompts_per_step=2,
        n=4,
        mini_batch_size=4,
        optim=OptimConfig(lr=5e-2),
        save_every=1,
        entropy_coef=0.05,
        stream=stream,  # all rewards are -1 here: the entropy term moves the policy
    )
    return rl_trainer(model, tokenizer, agent, _rows(), cfg, out)


def _stable(m: dict) -> dict:
    return {k: v for k, v in m.items() if not k.startswith(VOLATILE)}


def test_k0_is_the_synchronous_loop_to_the_bit(tokenizer, renderer, sandbox, tmp_path):
    """Two steps, two updates each (stale old log-probs recomputed, the correction applied): every metric and every
    weight equal."""
    sync = _trainer(tokenizer, renderer, sandbox, tmp_path / "sync", stream=StreamConfig())
    a = sync.train()
    streamed = _trainer(
        tokenizer, renderer, sandbox, tmp_path / "k0", stream=StreamConfig(True, max_staleness=0)
    )
    b = streamed.train()
    assert [_stable(m) for m in a] == [_stable(m) for m in b]
    assert a[1]["loss/total"] != a[0]["loss/total"]  # the steps differ: the comparison compares something
    assert [m["rollout/staleness"] for m in b] == [0.0, 0.0] and b[1]["stream/dropped_groups"] == 0.0
    for p, q in zip(sync.run.policy.parameters(), streamed.run.policy.parameters(), strict=True):
        assert torch.equal(p, q)
    assert streamed.sampling_mode.trained_groups == [(0, 0), (0, 1), (1, 0), (1, 1)]


def test_k1_streams_within_the_bound_and_resumes_without_training_a_group_twice(
    tokenizer, renderer, sandbox, tmp_path
):
    full = _trainer(tokenizer, renderer, sandbox, tmp_path / "full", stream=StreamConfig(True), steps=3)
    history = full.train()
    assert all(m["rollout/staleness_max"] <= 1.0 for m in history)
    assert len(set(full.sampling_mode.trained_groups)) == len(full.sampling_mode.trained_groups) == 6
    state = checkpoint_read.load_state(tmp_path / "full" / "checkpoint-1")["stream"]
    saved = [g.work.key for g in state["ready"]] + [w.key for w in state["unfinished"]]
    assert state["trained_groups"] == full.sampling_mode.trained_groups[:2]
    assert not set(saved) & set(state["trained_groups"]) and len(set(saved)) == len(saved)
    resumed = _trainer(tokenizer, renderer, sandbox, tmp_path / "resumed", stream=StreamConfig(True), steps=3)
    checkpoint.restore_trainer(resumed, tmp_path / "full" / "checkpoint-1")
    assert resumed.run.agent.engine.weight_version == 1
    rest = resumed.train()
    assert len(rest) == 2
    keys = resumed.sampling_mode.trained_groups
    assert keys[:2] == full.sampling_mode.trained_groups[:2] and len(set(keys)) == len(keys) == 6
    # what the checkpoint held is trained first or still waits: none of it was lost
    left = resumed.sampling_mode.producer.snapshot(0)
    assert set(saved) <= set(keys) | {w.key for w in left["unfinished"]} | {g.work.key for g in left["ready"]}


# ---- the producer on its own: a scripted agent --------------------------------------------------------------


class _Engine:
    weight_version = 0

    def awake(self):
        return contextlib.nullcontext()


class ScriptedAgent:
    """Answers every prompt with one sampled token at the engine's version; `block` holds rollouts, `fail` names
    the group (round, index by its first seed) whose rollout raises, as a dead server's would."""

    def __init__(self) -> None:
        self.engine = _Engine()
        self.config = AgentConfig()
        self.sandbox = None
        self.block = threading.Event()
        self.block.set()
        self.fail_seed: int | None = None
        self.lock = threading.Lock()
        self.running = self.peak = self.calls = 0

    def run(self, prompts, params, *, origins, generator=None, seeds=None):
        with self.lock:
            self.running += 1
            self.calls += 1
        try:
            self.block.wait(timeout=30)
            if self.fail_seed is not None and seeds[0] == self.fail_seed:
                raise RuntimeError("server died mid-generation")
            v = self.engine.weight_version
            out = []
            for o in origins:
                t = Trajectory.start([1, 2], o)
                t.response_ids, t.loss_mask, t.logprobs, t.token_versions = [7], [1], [-0.5], [v]
                t.weight_versions, t.turn_texts, t.stop_reason = [v], ["\\boxed{6}"], "answer"
                out.append(t)
            return out
        finally:
            with self.lock:
                self.running -= 1


def _works(round_: int, count: int) -> list[GroupWork]:
    row = ProblemRow("p", "arith", [{"role": "user", "content": "2 * 3?"}], "6")
    return [GroupWork(round_, i, row, (100 * round_ + i, 1)) for i in range(count)]


def _producer(agent, *, capacity: int = 4, k: int = 1, workers: int = 4) -> StreamProducer:
    return StreamProducer(
        agent, SamplingParams(), RewardConfig(), n=2, capacity=capacity, max_staleness=k, workers=workers
    )


def _no_refill():
    raise AssertionError("no refill expected")


def test_a_group_older_than_k_is_dropped_and_counted():
    agent = ScriptedAgent()
    prod = _producer(agent, k=1)
    prod.submit(_works(0, 2))
    first, _ = prod.take(2, version=0, refill=_no_refill)
    assert [g.version for g in first] == [0, 0]
    prod.submit(_works(1, 2))  # sampled at version 0 ...
    time.sleep(0.05)
    agent.engine.weight_version = 2  # ... and two syncs later they are too old for K = 1
    prod.submit(_works(2, 2))
    fresh, stats = prod.take(2, version=2, refill=_no_refill)
    assert [g.work.key for g in fresh] == [(2, 0), (2, 1)] and [g.version for g in fresh] == [2, 2]
    assert stats["stream/dropped_groups"] == 2.0 and stats["stream/dropped_total"] == 2.0
    prod.close()


def test_the_buffer_holds_at_most_buffer_groups_finished_or_in_flight():
    agent = ScriptedAgent()
    prod = _producer(agent, capacity=3, workers=6)
    prod.submit(_works(0, 10))
    deadline = time.monotonic() + 10
    while len(prod.snapshot(0)["ready"]) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)  # nothing more starts while the buffer is full
    assert agent.calls == 3 and len(prod.snapshot(0)["unfinished"]) == 7
    taken, stats = prod.take(2, version=0, refill=_no_refill)
    assert [g.work.key for g in taken] == [(0, 0), (0, 1)]
    assert stats["stream/buffer_groups"] <= 1.0
    prod.close()


def test_a_group_whose_server_dies_is_neither_lost_nor_trained_twice():
    agent = ScriptedAgent()
    agent.fail_seed = 1  # group (0, 1)
    prod = _producer(agent, workers=1)
    prod.submit(_works(0, 3))
    with pytest.raises(GroupFailed, match=r"group \(0, 1\) failed: server died"):
        prod.take(3, version=0, refill=_no_refill)
    state = prod.snapshot(0)
    prod.close()
    ready = [g.work.key for g in state["ready"]]
    unfinished = [w.key for w in state["unfinished"]]
    assert (0, 1) in unfinished and not set(ready) & set(unfinished)
    assert sorted(ready + unfinished) == [(0, 0), (0, 1), (0, 2)]
    agent.fail_seed = None  # the resumed run's server answers
    again = _producer(agent, workers=1)
    again.restore(state, version=0)
    taken, _ = again.take(3, version=0, refill=_no_refill)
    assert [g.work.key for g in taken] == [(0, 0), (0, 1), (0, 2)]
    again.close()


def test_restored_groups_keep_their_age_on_a_new_engine_counter():
    agent = ScriptedAgent()
    agent.engine.weight_version = 5
    prod = _producer(agent, k=1)
    prod.submit(_works(0, 1))
    prod.take(1, version=5, refill=_no_refill)
    prod.submit(_works(1, 1))
    time.sleep(0.05)
    state = prod.snapshot(version=6)  # the group is one update old
    prod.close()
    again = _producer(ScriptedAgent(), k=1)
    again.restore(state, version=1)  # a fresh server, synced once on resume
    (group,), _ = again.take(1, version=1, refill=_no_refill)
    assert isinstance(group, FinishedGroup) and group.version == 0 and group.trajs[0].weight_versions == [0]
    again.close()


# ---- start-up rules ----------------------------------------------------------------------------------------


def test_engines_that_cannot_stream_and_bad_settings_are_refused():
    on = StreamConfig(True)
    cfg = RLConfig(steps=1, prompts_per_step=2, n=2, mini_batch_size=2, stream=on)
    with pytest.raises(
        ValueError, match="rl.stream.enabled with rollout.engine=torch: it samples from the module"
    ):
        check_rl(cfg, RolloutConfig(engine="torch"), world=1)
    check_engine(cfg, capabilities_for("vllm"), SamplingParams(), world=1)
    with pytest.raises(ValueError, match="rollout.mode=lockstep"):
        check_rl(cfg, RolloutConfig(engine="vllm", mode="lockstep"), world=1)
    no_partial = EngineCapabilities("srv", "memory", "full", True, False, True, sync_gate=True)
    partial = RLConfig(
        steps=1, prompts_per_step=2, n=2, mini_batch_size=2, stream=StreamConfig(True, partial=True)
    )
    with pytest.raises(ValueError, match="rl.stream.partial with rollout.engine=srv: it cannot interrupt"):
        check_engine(partial, no_partial, SamplingParams(), world=1)
    no_gate = EngineCapabilities("srv", "memory", "full", True, False, True)
    with pytest.raises(ValueError, match="cannot wait for the requests in flight"):
        check_engine(cfg, no_gate, SamplingParams(), world=1)
    small = RLConfig(
        steps=1, prompts_per_step=4, n=2, mini_batch_size=4, stream=StreamConfig(True, buffer_groups=3)
    )
    with pytest.raises(ValueError, match="buffer_groups=3 holds fewer groups than a step takes"):
        check_engine(small, capabilities_for("vllm"), SamplingParams(), world=1)
    with pytest.raises(ValueError, match="rl.stream.enabled with rl.off_policy_steps=1"):
        RLConfig(off_policy_steps=1, stream=on)
    with pytest.raises(ValueError, match="needs rl.stream.enabled=true"):
        StreamConfig(partial=True)
    with pytest.raises(ValueError, match="max_staleness=-1"):
        StreamConfig(True, max_staleness=-1)
