"""bench/gpu.py end to end on a CPU at its tiny shape (`--device cpu --small`): every part runs and the JSON names the
device and versions; without CUDA, or on a CPU without --small, it refuses with the command to use."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "bench.gpu", *args], cwd=ROOT, capture_output=True, text=True, timeout=600
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal of a machine without CUDA")
def test_refuses_without_cuda_and_on_a_cpu_without_small(tmp_path):
    r = bench("--out", str(tmp_path / "gpu.json"))
    assert r.returncode == 2 and "--device cpu --small" in r.stderr
    r = bench("--device", "cpu", "--out", str(tmp_path / "gpu.json"))
    assert r.returncode == 2 and "add --small" in r.stderr
    assert not (tmp_path / "gpu.json").exists()


@pytest.mark.slow
def test_small_cpu_run_writes_every_part(tmp_path):
    out = tmp_path / "gpu.json"
    r = bench("--device", "cpu", "--small", "--out", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["machine"]["device"] == "cpu" and res["machine"]["torch"] and res["machine"]["transformers"]
    dec = res["decode"]["variants"]
    for name in (
        "torch engine fp32",
        "torch engine bf16 autocast",
        "HF generate fp32",
        "HF generate bf16 weights",
    ):
        assert dec[name]["tokens"] > 0 and dec[name]["tokens_per_s"] > 0, name
    assert dec["torch engine CUDA graphs bf16"].startswith("skipped")
    upd = res["update"]
    for name in ("tirl", "plain HF"):
        assert upd["variants"][name]["tokens_per_s"] > 0 and upd["variants"][name]["tflop_per_s"] > 0
    assert upd["real_tokens"] > 0 and upd["tirl_plan_estimate"]["total_gib"] > 0
    assert set(res["demo"]["stage_seconds"]) >= {"sft", "rl"}
