"""The GPU check's helpers (`gpu_runs.py`, `nccl_one_rank.py`) on a CPU: the arguments run, the metrics the GPU
tests read are logged, the readers find what differs, the one-rank worker shards, and the Qwen3-0.6B shape and the
update of test (g) build and run at small sizes; `gpu_check.py`, what `make gpu-check` runs, fails a check that
checked nothing. Not marked `gpu`: they run in `make test`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import gpu_check
import pytest
import torch
from bench.common import tirl_env
from gpu_runs import (
    above,
    command,
    differences,
    fp32_model,
    metric_rows,
    one_update,
    per_step,
    qwen3_shape,
    rl_args,
    run,
    sft_args,
    weight_gap,
    write_tiny,
)

from conftest import make_model
from tirl.train import checkpoint_write

QWEN3_06B_PARAMS = 596_049_920
EMBEDDING = 151_936 * 1024
PER_LAYER = (
    4 * 1024 * 1024 * 2 - 2 * 1024 * 1024 + 3 * 1024 * 3072 + 2 * 1024 + 2 * 128
)  # q,o 2M; k,v 1M; MLP; norms


@pytest.fixture(scope="module")
def tiny(tokenizer, tmp_path_factory):
    return write_tiny(tmp_path_factory.mktemp("gpu-helpers"), tokenizer)


def test_rl_arguments_log_what_the_gpu_checks_read(tiny, tmp_path):
    out = tmp_path / "rl"
    run(command(rl_args(tiny, out, "model.autocast=none", device="cpu", steps=2)))
    rows = metric_rows(out)
    assert [r["step"] for r in rows] == [0, 1] and not any(k.startswith("perf/") for r in rows for k in r)
    assert not above(per_step(rows, "rollout/logprob_diff_max"), 1e-4)  # the CPU: 2e-6
    assert max(per_step(rows, "loss/approx_kl")) > 1e-2  # lr 5e-2 moves the log-probs


def test_sft_arguments_lower_the_loss(tiny, tmp_path):
    out = tmp_path / "sft"
    run(command(sft_args(tiny, out, device="cpu")))
    losses = per_step(metric_rows(out), "sft/loss")
    assert len(losses) == 15 and sum(losses[-3:]) / 3 < losses[0] - 1.0, losses


@pytest.mark.slow
def test_one_rank_worker_shards_over_gloo(tiny, tmp_path):
    out = tmp_path / "rl"
    args = rl_args(tiny, out, "model.autocast=none", "rl.save_every=1", device="cpu", steps=1)
    proc = run(command(["--backend", "gloo", *args], nproc=1, worker=True))
    assert "process group: gloo, world size 1" in proc.stdout
    assert (out / "checkpoint-1" / checkpoint_write.DCP_DIR).is_dir()
    assert not above(per_step(metric_rows(out), "rollout/logprob_diff_max"), 1e-4)


def test_readers_name_every_difference_and_a_missing_metric(tmp_path):
    rows = [{"step": 0, "a": 1.0, "time": 5.0, "perf/x": 1.0}, {"step": 1, "a": 2.0}, {"note": "no step"}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = metric_rows(tmp_path)
    assert got == [{"step": 0, "a": 1.0}, {"step": 1, "a": 2.0}]
    assert per_step(got, "a") == [1.0, 2.0]
    with pytest.raises(AssertionError, match="b missing at steps"):
        per_step(got, "b")
    assert [step for step, _ in above([0.1, float("nan"), 3.0, 1.0], 1.0)] == [1, 2, 3]  # NaN counts
    other = [{"step": 0, "a": 1.0 + 1e-9}, {"step": 1, "a": 2.5, "c": 1}]
    assert differences(got, other) == {0: {"a": (1.0, 1.0 + 1e-9)}, 1: {"a": (2.0, 2.5), "c": (None, 1)}}
    assert differences(got, other, rel=1e-6) == {1: {"a": (2.0, 2.5), "c": (None, 1)}}


def test_weight_gap_is_relative_and_tells_bit_equality(tokenizer, tmp_path):
    model = make_model(tokenizer)
    model.save_pretrained(tmp_path / "a")
    assert weight_gap(tmp_path / "a", tmp_path / "a") == (True, 0.0)
    with torch.no_grad():
        model.model.norm.weight.mul_(1.01)  # a 1% change of one tensor
    model.save_pretrained(tmp_path / "b")
    exact, gap = weight_gap(tmp_path / "a", tmp_path / "b")
    assert not exact and gap == pytest.approx(0.01, rel=1e-3)


def test_qwen3_06b_shape_at_full_and_reduced_depth():
    from tirl.train.plan import meta_model

    full, two = qwen3_shape(), qwen3_shape(2)
    assert (full.hidden_size, full.num_hidden_layers, full.num_attention_heads, full.num_key_value_heads) == (
        1024, 28, 16, 8
    )  # fmt: skip
    assert (full.head_dim, full.intermediate_size, full.vocab_size, full.tie_word_embeddings) == (
        128, 3072, 151_936, True
    )  # fmt: skip
    assert sum(p.numel() for p in meta_model(full).parameters()) == QWEN3_06B_PARAMS
    assert EMBEDDING + 1024 + 28 * PER_LAYER == QWEN3_06B_PARAMS
    assert two.num_hidden_layers == 2 and sum(p.numel() for p in meta_model(two).parameters()) == (
        EMBEDDING + 1024 + 2 * PER_LAYER
    )


def test_the_qwen3_model_of_test_g_has_fp32_master_weights():
    """Qwen3-0.6B's config says bfloat16, and a model built from it without a dtype has bf16 weights (and would
    train them with a bf16 AdamW); `fp32_model` gives fp32 ones. Checked at a tiny width."""
    from transformers import AutoModelForCausalLM

    cfg = qwen3_shape(1)
    cfg.vocab_size, cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads = 512, 64, 128, 4
    cfg.num_key_value_heads, cfg.head_dim = 2, 16
    assert str(cfg.dtype).removeprefix("torch.") == "bfloat16"
    assert {p.dtype for p in AutoModelForCausalLM.from_config(cfg).parameters()} == {torch.bfloat16}
    assert {p.dtype for p in fp32_model(cfg, "cpu").parameters()} == {torch.float32}


def test_one_update_splits_by_the_budget_and_steps(tokenizer):
    torch.manual_seed(0)
    model = make_model(tokenizer)
    before = [p.detach().clone() for p in model.parameters()]
    r = one_update(model, batch=8, seq=64, autocast=None, activation_gib=1e-6)  # the 256-token floor
    assert r["tokens_per_micro_batch"] == 256 and r["micro_batches"] == 2, r
    assert r["stepped"] and r["loss_finite"] and r["peak_beyond_state_gib"] is None
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


ROOT = Path(__file__).resolve().parents[2]


def test_gpu_check_without_cuda_fails_saying_nothing_was_checked():
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # no CUDA device, on a GPU machine too
    check = [sys.executable, str(ROOT / "tests" / "gpu" / "gpu_check.py")]
    proc = subprocess.run(check, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == gpu_check.NOTHING_CHECKED == 3, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "no CUDA GPU: nothing was checked" in proc.stderr
    recipe = (ROOT / "Makefile").read_text().split("\ngpu-check:", 1)[1].split("\n\n", 1)[0]
    assert "tests/gpu/gpu_check.py" in recipe  # what `make gpu-check` runs


def fake_pytest(*outcomes: str, code: int = 0):
    """pytest.main's stand-in: reports one test per outcome ("passed", "failed", "skipped") to the plugins."""

    def run(args, plugins):
        for outcome in outcomes:
            report = SimpleNamespace(when="call", passed=outcome == "passed", failed=outcome == "failed",
                                     skipped=outcome == "skipped")  # fmt: skip
            for plugin in plugins:
                plugin.pytest_runtest_logreport(report)
        return code

    return run


@pytest.mark.parametrize(
    "outcomes, code, expected",
    [
        (("skipped",) * 11, 0, 3),  # every test skipped: nothing was checked
        ((), 5, 3),  # none collected
        (("skipped", "passed"), 0, 0),
        (("skipped", "failed"), 1, 1),  # pytest's failure stands
    ],
)
def test_gpu_check_fails_when_no_test_ran_on_the_gpu(monkeypatch, capsys, outcomes, code, expected):
    monkeypatch.setattr(gpu_check, "cuda_available", lambda: True)
    assert gpu_check.main(run=fake_pytest(*outcomes, code=code)) == expected
    said = capsys.readouterr().err
    assert ("nothing was checked" in said) == (expected == 3), said


def test_subprocesses_keep_the_python_path_and_collection_keeps_cuda_visible(monkeypatch):
    """On the GPU machine tirl's dependencies came as wheels on PYTHONPATH, and pytest collects every test module:
    the runs' environment keeps that path, and importing test_dist's worker module must not hide the GPU
    (`CUDA_VISIBLE_DEVICES=""` is for its own torchrun processes only)."""
    monkeypatch.setenv("PYTHONPATH", "/tmp/site")
    assert tirl_env()["PYTHONPATH"].split(os.pathsep) == [str(ROOT / "src"), "/tmp/site"]
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    code = "import os, sys; sys.path.insert(0, 'tests/train'); import dist_worker; print(repr(os.environ.get('CUDA_VISIBLE_DEVICES')))"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**env, "PYTHONPATH": str(ROOT / "src")},
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "None"
