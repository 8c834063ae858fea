"""`rollout.vllm.placement: colocated`: the sleep/wake control flow with a fake vLLM backend, and the refusal on CPU.

The fake backend samples with the torch engine from its own copy of the policy and records every call, so one RL
step through the real trainer shows the order: wake, sample, sleep, update, wake the weights, load, reset the
prefix cache, sleep. The real backend (`VLLMBackend`) needs a GPU and vLLM in the trainer's environment.
"""

from __future__ import annotations

import copy

import pytest
import torch

from conftest import make_agent, make_model
from tirl.rewards.shaping import RewardConfig
from tirl.rollout.config import RolloutConfig
from tirl.rollout.engines.torch.engine import TorchEngine
from tirl.rollout.engines.vllm.colocated import ColocatedEngine
from tirl.rollout.engines.vllm.config import VllmConfig
from tirl.rollout.engines.vllm.spec import preflight
from tirl.rollout.sampling import SamplingParams
from tirl.train.rl.run import assemble
from tirl.train.rl.trainer import RLConfig, RLTrainer


class FakeBackend:
    """vLLM's LLM as the colocated engine sees it, over a torch engine on a copy of the policy."""

    def __init__(self, model, renderer):
        self.model = copy.deepcopy(model)
        self.inner = TorchEngine(self.model, eos_ids=[renderer.eos_id], pad_id=renderer.pad_id)
        self.calls: list[str] = []
        self.weights_on, self.kv_on = True, True

    def generate(self, prompts, params, budgets, seeds):
        assert self.weights_on and self.kv_on, "sampled while asleep"
        self.calls.append("generate")
        gen = torch.Generator().manual_seed(seeds[0])
        gens = self.inner.generate(prompts, params, max_new_tokens=budgets, generator=gen)
        return [(g.token_ids, g.logprobs, "length" if g.finish_reason == "length" else "stop") for g in gens]

    def sleep(self):
        self.calls.append("sleep")
        self.weights_on = self.kv_on = False

    def wake_up(self, tags=None):
        self.calls.append(f"wake:{','.join(tags) if tags else 'all'}")
        self.weights_on = self.weights_on or not tags or "weights" in tags
        self.kv_on = self.kv_on or not tags or "kv_cache" in tags

    def load_weights(self, weights):
        assert self.weights_on and not self.kv_on, "weights load with the KV cache freed"
        self.calls.append("load")
        own = dict(self.model.named_parameters())
        with torch.no_grad():
            for name, t in weights:
                own[name].copy_(t)

    def reset_prefix_cache(self):
        self.calls.append("reset")


def test_rollouts_wake_the_engine_and_updates_find_it_asleep(tokenizer, renderer, sandbox, tmp_path):
    torch.manual_seed(0)
    model = make_model(tokenizer)
    agent = make_agent(model, renderer, sandbox, max_tokens=8)
    backend = FakeBackend(model, renderer)
    agent.engine = ColocatedEngine(backend, eos_ids=[renderer.eos_id])
    assert backend.calls == ["sleep"]  # built awake, asleep until the first rollout
    rows = [
        {"prompt": [{"role": "user", "content": "What is 2 * 3?"}], "reward_model": {"ground_truth": "6"}}
    ]
    cfg = RLConfig(steps=2, prompts_per_step=1, n=2, mini_batch_size=2, entropy_coef=0.05)
    trainer = RLTrainer(assemble(
        model, tokenizer, agent, rows, cfg, sampling=SamplingParams(), reward=RewardConfig(), out_dir=tmp_path,
        seed=0,
    ))  # fmt: skip
    backend.calls.clear()
    m = trainer.step()
    assert backend.calls[0] == "wake:all" and backend.calls[-5:] == [
        "sleep",
        "wake:weights",
        "load",
        "reset",
        "sleep",
    ]
    assert set(backend.calls[1:-5]) == {"generate"}
    assert m["rollout/logprob_diff_max"] < 1e-5  # the engine sampled the policy's weights
    for (name, a), b in zip(model.named_parameters(), backend.model.parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=0, msg=name)  # the update reached the engine exactly
    assert agent.engine.weight_version == 1
    assert trainer.step()["rollout/logprob_diff_max"] < 1e-5  # and the next rollout sampled from it


def test_generate_outside_a_rollout_wakes_the_engine(tokenizer, renderer):
    backend = FakeBackend(make_model(tokenizer), renderer)
    engine = ColocatedEngine(backend, eos_ids=[renderer.eos_id])
    engine.sync_weights(backend.model)  # asleep -> weights only -> asleep
    assert backend.calls == ["sleep", "wake:weights", "load", "reset", "sleep"]
    engine.generate([[1, 2, 3]], SamplingParams(max_new_tokens=2), seeds=[0])  # an evaluation between steps
    assert backend.calls[-2:] == ["wake:all", "generate"] and engine.state == "awake"


def test_colocated_is_refused_without_a_gpu_before_loading_anything(monkeypatch, tmp_path):
    from tirl.commands.run_config import TirlConfig
    from tirl.commands.stages import run_rl
    from tirl.core.config import load_config

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    preflight(RolloutConfig(engine="vllm"))
    with pytest.raises(ValueError, match="rollout.vllm.placement=colocated .* this machine has no CUDA GPU"):
        preflight(RolloutConfig(engine="vllm", vllm=VllmConfig(placement="colocated")))
    overrides = [
        "rollout.engine=vllm",
        "rollout.vllm.placement=colocated",
        f"model.path={tmp_path / 'absent'}",
    ]
    with pytest.raises(ValueError, match="no CUDA GPU; use rollout.vllm.placement=separate"):
        run_rl(load_config(TirlConfig, None, overrides), tmp_path / "out")
    assert not (tmp_path / "out").exists()
