"""Shared fixtures: a tiny tokenizer and Qwen2 model built by the tests themselves (no hub, a few seconds)."""

from __future__ import annotations

import socket

import pytest
import torch

from tirl.chat.template import ChatRenderer, conversation_text
from tirl.models.tiny import TinyModelConfig, build_model, train_tokenizer
from tirl.rollout.agent.loop import AgentConfig, AgentLoop
from tirl.rollout.engines.torch.engine import TorchEngine
from tirl.sandbox import LocalSandbox, SandboxConfig
from tirl.tasks.arith.problems import generate_problems
from tirl.tools.code_interpreter import CODE_INTERPRETER_SCHEMA

TOOL = {"type": "function", "function": {"name": "code_interpreter", "arguments": {"code": "print(12 * 34)"}}}


def sample_conversation() -> list[dict]:
    return [
        {"role": "user", "content": "What is 12 * 34?"},
        {"role": "assistant", "content": "I will compute it with Python.", "tool_calls": [TOOL]},
        {"role": "tool", "content": "408\n"},
        {"role": "assistant", "content": "The answer is \\boxed{408}."},
    ]


def build_test_tokenizer():
    texts = [conversation_text(sample_conversation())]
    for p in generate_problems(200, seed=0):
        texts.append(
            conversation_text(
                [
                    {"role": "user", "content": p.question},
                    {
                        "role": "assistant",
                        "content": "I will compute it with Python.",
                        "tool_calls": [
                            {
                                "function": {
                                    "name": "code_interpreter",
                                    "arguments": {"code": f"print({p.expression})"},
                                }
                            }
                        ],
                    },
                    {"role": "tool", "content": f"{p.answer}\n"},
                    {"role": "assistant", "content": f"The answer is \\boxed{{{p.answer}}}."},
                ],
                add_generation_prompt=False,
            )
        )
    assert CODE_INTERPRETER_SCHEMA["function"]["name"] == "code_interpreter"
    return train_tokenizer(texts, vocab_size=512)


@pytest.fixture(scope="session")
def tokenizer():
    return build_test_tokenizer()


@pytest.fixture(scope="session")
def renderer(tokenizer) -> ChatRenderer:
    return ChatRenderer(tokenizer)


def make_model(tokenizer, seed: int = 0, max_positions: int = 1024):
    cfg = TinyModelConfig(
        hidden_size=64,
        intermediate_size=128,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        max_positions=max_positions,
    )
    return build_model(tokenizer, cfg, seed=seed).eval()


def closed_by_peer(s: socket.socket, wait_s: float) -> bool:
    """Whether the other end closed `s` (EOF or a reset) within `wait_s`: a server dropping a connection."""
    s.settimeout(wait_s)
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def make_agent(model, renderer, sandbox, max_tokens: int):
    """A real engine and agent loop over `model`, with one token budget for the turn and the whole response."""
    engine = TorchEngine(model, eos_ids=[renderer.eos_id], pad_id=renderer.pad_id)
    return AgentLoop(
        engine, renderer, sandbox, AgentConfig(max_response_tokens=max_tokens, max_tokens_per_turn=max_tokens)
    )


@pytest.fixture()
def model(tokenizer):
    torch.manual_seed(0)
    return make_model(tokenizer)


@pytest.fixture(scope="session")
def sandbox():
    with LocalSandbox(SandboxConfig(timeout_s=5.0)) as sb:
        yield sb


def rl_trainer(model, tokenizer, agent, rows, cfg, out_dir, *, seed: int = 0, **kw):
    """An RLTrainer over these parts as the RL stage assembles them (`tirl.train.rl.run.assemble`), sampling with
    the defaults and grading with the default reward unless `kw` says otherwise."""
    from tirl.rewards.shaping import RewardConfig
    from tirl.rollout.sampling import SamplingParams
    from tirl.train.rl.run import assemble
    from tirl.train.rl.trainer import RLTrainer

    kw = {"sampling": SamplingParams(), "reward": RewardConfig(), **kw}
    return RLTrainer(assemble(model, tokenizer, agent, rows, cfg, out_dir=out_dir, seed=seed, **kw))


def say_rows(n: int) -> list[dict]:
    """`n` one-turn SFT conversations ("Say d." -> "\\boxed{d}"): what the SFT resume and safety tests train on."""
    return [
        {
            "messages": [
                {"role": "user", "content": f"Say {d}."},
                {"role": "assistant", "content": f"\\boxed{{{d}}}"},
            ]
        }
        for d in range(n)
    ]
