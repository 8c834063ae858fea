"""`make gpu-check` on one CUDA GPU with nothing but PyTorch: tirl's own paths on the GPU, no vLLM, in 152 s on
one H100 (2026-11-27, docs/results/gpu/gpu-check.log).

Every RL run is `tirl rl` on the tests' tiny Qwen2 (random weights) at lr 5e-2 with two mini-batches per step and
the old log-probs recomputed (`gpu_runs.rl_args`), so each step logs `rollout/logprob_diff_max`, the largest
engine/trainer log-prob gap, after the previous step's updates moved the log-probs by far more (`loss/approx_kl`
checks that they moved): a gap below the line at every step means the engine sampled from the weights the trainer
holds, in the same precision. Lines: 1e-3 in float32 (TF32 off, PyTorch's default; the CPU gives 2e-6), 0.1 under
bf16 autocast (the CPU gives 0.015; a stale bf16 head weight gave 2.6).

Skipped without CUDA; the NCCL check also without NCCL. `test_gpu_helpers.py` runs the same helpers on a CPU.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed
from gpu_runs import (
    above,
    command,
    differences,
    fp32_model,
    kill_after,
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

from tirl.train import checkpoint_write, manifest

CUDA = torch.cuda.is_available()
FP32_LINE = 1e-3
BF16_LINE = 0.1
MOVED = 1e-2  # the smallest loss/approx_kl of a step's updates that shows the log-probs moved
FP32 = ("model.autocast=none",)  # on CUDA `auto` picks bf16

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not CUDA, reason="no CUDA GPU: make gpu-check runs on a GPU machine"),
]


@pytest.fixture(scope="module")
def tiny(tokenizer, tmp_path_factory) -> Path:
    return write_tiny(tmp_path_factory.mktemp("gpu-torch"), tokenizer)


@pytest.fixture(scope="module")
def full_run(tiny, tmp_path_factory) -> Path:
    """Four fp32 RL steps on the GPU with a checkpoint every two: test (a)'s run and (c)'s uninterrupted one."""
    out = tmp_path_factory.mktemp("gpu-full") / "rl"
    run(command(rl_args(tiny, out, *FP32, "rl.save_every=2", steps=4)))
    return out


def check_logprobs(out: Path, line: float, steps: int) -> list[dict]:
    rows = metric_rows(out)
    assert [r["step"] for r in rows] == list(range(steps))
    gaps = per_step(rows, "rollout/logprob_diff_max")
    assert not above(gaps, line), f"engine/trainer log-prob gap over {line}: {gaps}"
    assert max(per_step(rows, "loss/approx_kl")) > MOVED, "the updates did not move the log-probs"
    return rows


def test_a_torch_engine_rl_on_cuda_samples_from_the_updated_weights(full_run):
    check_logprobs(full_run, FP32_LINE, 4)
    assert (full_run / "model" / "config.json").is_file()


@pytest.mark.skipif(not torch.distributed.is_nccl_available(), reason="this PyTorch has no NCCL")
def test_b_torchrun_one_process_nccl_fsdp2(tiny, tmp_path):
    """One rank in an NCCL group (`nccl_one_rank.py`), so the model is sharded by FSDP2 on a CUDA mesh of one."""
    out = tmp_path / "rl"
    proc = run(
        command(
            rl_args(tiny, out, *FP32, "dist.backend=nccl", "rl.save_every=1", steps=2), nproc=1, worker=True
        )
    )
    assert "process group: nccl, world size 1" in proc.stdout
    check_logprobs(out, FP32_LINE, 2)
    assert (out / "checkpoint-1" / checkpoint_write.DCP_DIR).is_dir()  # written sharded: FSDP2 was on
    assert (out / "model" / "model.safetensors").is_file()  # gathered to a plain model at the end


def test_c_killed_and_resumed_on_cuda_continues(tiny, full_run, tmp_path):
    """Killed after checkpoint 2, resumed: the same metrics and weights as `full_run`. Compared with a tolerance:
    CUDA kernels need not be bit-reproducible between processes (atomics in SDPA's backward); a warning says when
    the runs were not bit-identical. A resume that lost the optimizer state or the data order misses by far more."""
    cut = tmp_path / "cut"
    args = rl_args(tiny, cut, *FP32, "rl.save_every=2", steps=4)
    kill_after(command(args), cut / "checkpoint-2" / manifest.MANIFEST)
    proc = run(command([*args, "--resume", "auto"]))
    assert "at step 2 of 4" in proc.stdout
    a, b = metric_rows(full_run), metric_rows(cut)
    assert [m["step"] for m in b] == [0, 1, 2, 3]
    assert differences(b, a, rel=1e-4, abs_=1e-6) == {}
    exact, gap = weight_gap(full_run / "model", cut / "model")
    assert gap < 1e-3, f"resumed weights {gap:.2e} (relative) from the uninterrupted run's"
    if not exact or differences(b, a):
        warnings.warn(
            f"CUDA resume within tolerance but not bit-identical (weights {gap:.1e} apart)", stacklevel=1
        )


def test_d_bf16_autocast_rl(tiny, tmp_path):
    """model.autocast=bfloat16: the trainer under bf16 autocast, the engine decoding under it too (rollout.dtype
    auto), fp32 master weights and AdamW state."""
    out = tmp_path / "rl"
    run(command(rl_args(tiny, out, "model.autocast=bfloat16")))
    check_logprobs(out, BF16_LINE, 3)


def test_e_sft_on_cuda(tiny, tmp_path):
    out = tmp_path / "sft"
    run(command(sft_args(tiny, out)))
    losses = per_step(metric_rows(out), "sft/loss")
    assert len(losses) == 15 and all(x == x for x in losses)
    assert sum(losses[-3:]) / 3 < losses[0] - 1.0, losses
    assert (out / "model" / "config.json").is_file()


def test_f_lora_rl_on_cuda(tiny, tmp_path):
    out = tmp_path / "rl"
    run(command(rl_args(tiny, out, *FP32, "model.lora.rank=8")))
    check_logprobs(out, FP32_LINE, 3)


def test_g_auto_micro_batches_fit_a_qwen3_06b_update():
    """`micro_batch_tokens: auto` on the GPU (a quarter of its memory for activations, `tirl.train.memory`) splits
    16 x 2,048 tokens of a Qwen3-0.6B-shaped model (random weights, fp32 master weights, bf16 autocast) into
    micro-batches that fit: one update runs without running out of memory, and the micro-batches' peak beyond the
    weights and gradients stays within the budget (the estimate is +-25%)."""
    model = fp32_model(qwen3_shape(), "cuda")
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    r = one_update(model, batch=16, seq=2048, autocast=torch.bfloat16)
    assert r["stepped"] and r["loss_finite"], r
    assert r["micro_batches"] >= 2, r  # 32k tokens do not fit one pass of the budget
    assert r["peak_beyond_state_gib"] <= 1.25 * r["budget_gib"], r
