"""Same command, same bits: an RL run whose sandbox answers come back after other delays (so the asynchronous
loop's trajectories finish in other orders), on a machine with another amount of free memory, logs the same
metrics and ends with the same weights, to the bit; a run resumed from a checkpoint under other timing too.

The sandbox is wrapped by a fault injector that sleeps a per-call random amount (its own seed per run) before
answering; the load is a fake /proc/meminfo whose MemAvailable differs between the runs (MemTotal, the machine,
stays the same).
"""

from __future__ import annotations

import hashlib
import itertools
import random
import threading
import time
from pathlib import Path

import pytest
import torch

from conftest import make_model, rl_trainer
from tirl.rewards.shaping import RewardConfig
from tirl.rollout.agent.async_loop import AsyncAgentLoop
from tirl.rollout.agent.loop import AgentConfig, AgentLoop
from tirl.rollout.engines.torch.engine import TorchEngine
from tirl.rollout.sampling import SamplingParams
from tirl.tasks.arith.problems import generate_problems
from tirl.train import checkpoint, memory
from tirl.train.optim import OptimConfig
from tirl.train.rl.config import KLConfig
from tirl.train.rl.trainer import RLConfig
from tirl.train.sft import SFTConfig, train_sft

GIB = 1024**3
# the demo's shaping: rewards (and so advantages) vary with the tool calls and the lengths
REWARD = RewardConfig(tool_call_bonus=True, overlong=True, overlong_buffer=48)


class DelayedSandbox:
    """Answers as `inner` does, each call after a random delay of up to `max_s` (seeded): under the async loop the
    trajectories' tool results, and so their next turns, arrive in another order for another seed."""

    def __init__(self, inner, seed: int, max_s: float = 0.03) -> None:
        self.inner, self.rng, self.max_s, self.lock = inner, random.Random(seed), max_s, threading.Lock()
        self.calls = itertools.count()

    def run_batch(self, codes, *, stdins=None, timeout_s=None):
        with self.lock:
            delay = self.rng.uniform(0, self.max_s)
            next(self.calls)
        out = self.inner.run_batch(codes, stdins=stdins, timeout_s=timeout_s)
        time.sleep(delay)
        return out


def fake_meminfo(monkeypatch, available_gib: float) -> None:
    """The trainer sees a 16 GiB machine with `available_gib` free and no cgroup limit."""
    real = Path
    text = f"MemTotal: {16 * GIB // 1024} kB\nMemAvailable: {int(available_gib * GIB) // 1024} kB\n"

    class FakePath(type(real())):
        def read_text(self, *a, **kw):
            if str(self) == "/proc/meminfo":
                return text
            if str(self).startswith("/sys/fs/cgroup"):
                raise OSError("no cgroup")
            return super().read_text(*a, **kw)

    monkeypatch.setattr(memory, "Path", FakePath)


def conversation(p) -> dict:
    call = {
        "type": "function",
        "function": {"name": "code_interpreter", "arguments": {"code": f"print({p.expression})"}},
    }
    return {
        "messages": [
            {"role": "user", "content": p.question},
            {"role": "assistant", "content": "I will compute it with Python.", "tool_calls": [call]},
            {"role": "tool", "content": f"{p.answer}\n"},
            {"role": "assistant", "content": f"The answer is \\boxed{{{p.answer}}}."},
        ]
    }


@pytest.fixture(scope="module")
def start(tokenizer, renderer):
    """A tiny policy taught to call the tool (so every step runs snippets in the sandbox), as a state dict."""
    torch.manual_seed(0)
    model = make_model(tokenizer).train()
    rows = [conversation(p) for p in generate_problems(40, seed=0)]
    cfg = SFTConfig(epochs=30, batch_size=20, optim=OptimConfig(lr=3e-3))
    train_sft(model, renderer, rows, cfg, pad_id=tokenizer.pad_token_id, seed=0)
    return {k: v.clone() for k, v in model.state_dict().items()}


def weights_hash(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for k, v in sorted(model.state_dict().items()):
        h.update(k.encode())
        h.update(v.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def trainer(start, tokenizer, renderer, sandbox, mode, out, *, save_every=0):
    torch.manual_seed(0)
    model = make_model(tokenizer)
    model.load_state_dict(start)
    engine = TorchEngine(model, eos_ids=[renderer.eos_id], pad_id=renderer.pad_id)
    agent_cfg = AgentConfig(max_response_tokens=96, max_tokens_per_turn=48)
    if mode == "async":
        agent = AsyncAgentLoop(engine, renderer, sandbox, agent_cfg, concurrency=8)
    else:
        agent = AgentLoop(engine, renderer, sandbox, agent_cfg)
    rows = [p.to_row() for p in generate_problems(8, seed=3)]
    cfg = RLConfig(
        steps=3, prompts_per_step=4, n=4, mini_batch_size=8, kl=KLConfig(coef=0.01), save_every=save_every,
        optim=OptimConfig(lr=1e-2),
    )  # fmt: skip
    return rl_trainer(model, tokenizer, agent, rows, cfg, out, reward=REWARD, seed=3)


def rows_of(history) -> list[dict]:
    """Every logged number but the clocks and memory readings."""
    return [{k: v for k, v in m.items() if not k.startswith(("time/", "perf/"))} for m in history]


def differences(got: list[dict], want: list[dict]) -> dict:
    """{step: {key: (got, want)}} of every number that differs; {} when the rows are the same to the bit."""
    assert len(got) == len(want)
    out = {}
    for step, (a, b) in enumerate(zip(got, want, strict=True)):
        diff = {k: (a.get(k), b.get(k)) for k in a.keys() | b.keys() if a.get(k) != b.get(k)}
        if diff:
            out[step] = diff
    return out


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["lockstep", "async"])
def test_rl_is_bit_identical_whatever_the_timing(
    mode, start, tokenizer, renderer, sandbox, tmp_path, monkeypatch
):
    fake_meminfo(monkeypatch, 12.0)  # a quiet machine
    quiet = trainer(
        start, tokenizer, renderer, DelayedSandbox(sandbox, seed=1), mode, tmp_path / "a", save_every=2
    )
    first = rows_of(quiet.train())
    assert sum(m["rollout/tool_calls_per_response"] for m in first) > 0.5  # the sandbox's timing is in play

    fake_meminfo(monkeypatch, 0.05)  # the same machine under load: 50 MiB free
    busy = trainer(start, tokenizer, renderer, DelayedSandbox(sandbox, seed=2), mode, tmp_path / "b")
    assert differences(rows_of(busy.train()), first) == {}
    assert weights_hash(busy.run.policy) == weights_hash(quiet.run.policy)

    # killed after step 2 and resumed under yet other timing: the last step and the weights are the same again
    resumed = trainer(start, tokenizer, renderer, DelayedSandbox(sandbox, seed=3), mode, tmp_path / "c")
    checkpoint.restore_trainer(resumed, tmp_path / "a" / "checkpoint-2")
    assert differences(rows_of(resumed.train()), first[2:]) == {}
    assert weights_hash(resumed.run.policy) == weights_hash(quiet.run.policy)


def test_async_rollouts_do_not_depend_on_completion_order(start, tokenizer, renderer, sandbox):
    """The torch engine under the async loop: each trajectory's turns continue its own kept prefix, never one that
    another trajectory's request happened to drop, so ids and log-probs are the same to the bit in any order."""
    model = make_model(tokenizer)
    model.load_state_dict(start)
    prompts = [p.to_row()["prompt"] for p in generate_problems(4, seed=3) for _ in range(4)]

    def rollout(seed: int) -> list:
        engine = TorchEngine(model, eos_ids=[renderer.eos_id], pad_id=renderer.pad_id)
        cfg = AgentConfig(max_response_tokens=96, max_tokens_per_turn=48)
        loop = AsyncAgentLoop(engine, renderer, DelayedSandbox(sandbox, seed), cfg, concurrency=8)
        trajs = loop.run(prompts, SamplingParams(), generator=torch.Generator().manual_seed(5))
        assert engine.kept.reused_tokens > 0  # later turns did continue kept prefixes
        return [(t.response_ids, t.logprobs, t.turns) for t in trajs]

    first = rollout(1)
    assert sum(turns > 1 for _, _, turns in first) >= 4  # several trajectories came back from the sandbox
    assert rollout(2) == first


def test_cpu_micro_batches_do_not_follow_the_free_memory(monkeypatch):
    """The auto budget is the machine's, not what is free at start-up: the split into micro-batches changes the
    update's float sums."""
    fake_meminfo(monkeypatch, 12.0)
    quiet = memory.budget_bytes("cpu")
    fake_meminfo(monkeypatch, 0.05)
    assert memory.budget_bytes("cpu")[0] == quiet[0] == GIB
