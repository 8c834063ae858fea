"""bench/gpu.py on a CPU at its tiny shape (`--device cpu --small`): every figure runs in the precision its name
says (read from the model that ran it); end to end, every part runs and the JSON names the device and versions;
without CUDA, or on a CPU without --small, it refuses with the command to use."""

from __future__ import annotations

import importlib
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


SHORT = {"float32": "fp32", "bfloat16": "bf16"}


def test_every_figure_runs_in_the_precision_it_names():
    """Qwen3's config asks for bf16 weights: each decode row's model has the weights its name says and computes as
    it says; the update keeps fp32 parameters and AdamW state under bf16 autocast (tirl's RL update)."""
    gpu = importlib.import_module("bench.gpu")
    cfg, dims = gpu.model_config(small=True), {**gpu.SMALL, "new": 2}
    rows = gpu.decode(cfg, dims, "cpu")["variants"]
    assert set(rows) == {name for name, _, _ in gpu.DECODE}
    for name, weights, _ in gpu.DECODE:
        row = rows[name]
        if "CUDA graphs" in name:
            assert row.startswith("skipped")
            continue
        assert f"{SHORT[weights]} weights" in name and row["weights"] == weights, (name, row)
        autocast = "bf16 autocast" in name
        assert row["compute"] == ("bfloat16 autocast" if autocast else weights), (name, row)
    for name, row in gpu.update(cfg, dims, "cpu")["variants"].items():
        assert (row["params"], row["optimizer_state"], row["compute"]) == (
            "float32",
            "float32",
            "bfloat16 autocast",
        ), name


def test_profile_says_where_a_decode_step_and_an_update_spend_their_time():
    """`--profile`: the engine's bf16 decode row and tirl's update carry a profile (on a CPU: host times, a device
    busy for 0 ms); rows not profiled carry none, and the timed figures are the same fields as without it."""
    gpu = importlib.import_module("bench.gpu")
    cfg, dims = gpu.model_config(small=True), {**gpu.SMALL, "new": 3}
    rows = gpu.decode(cfg, dims, "cpu", profile=True)["variants"]
    prof = rows["torch engine, fp32 weights, bf16 autocast"]["profile"]
    assert prof["steps"] == 3 and prof["wall_ms_per_step"] > 0 and prof["device_busy_ms_per_step"] == 0
    assert 0 < len(prof["top_ops"]) <= gpu.TOP_OPS and all(op["calls"] >= 1 for op in prof["top_ops"])
    hosts = [op["self_host_ms"] for op in prof["top_ops"]]
    assert hosts == sorted(hosts, reverse=True) and any("aten::" in op["op"] for op in prof["top_ops"])
    assert (
        "profile" not in rows["torch engine, fp32 weights, fp32"]
        and "profile" not in rows["HF generate, bf16 weights"]
    )
    upd = gpu.update(cfg, dims, "cpu", profile=True)["variants"]
    assert upd["tirl"]["profile"]["steps"] == 1 and upd["tirl"]["profile"]["top_ops"]
    assert "profile" not in upd["plain HF"]

    def broken() -> None:
        raise RuntimeError("CUPTI_ERROR_NOT_INITIALIZED")

    assert gpu.where_time_goes(broken, "cpu", 1) == {"error": "RuntimeError: CUPTI_ERROR_NOT_INITIALIZED"}


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
    for name, row in dec.items():
        if "CUDA graphs" in name:
            assert row.startswith("skipped")
        else:
            assert row["tokens"] > 0 and row["tokens_per_s"] > 0, name
    upd = res["update"]
    for name in ("tirl", "plain HF"):
        assert upd["variants"][name]["tokens_per_s"] > 0 and upd["variants"][name]["tflop_per_s"] > 0
    assert upd["real_tokens"] > 0 and upd["tirl_plan_estimate"]["total_gib"] > 0
    assert 0 <= upd["padding_share"] <= upd["padding_share_fixed_4"] < 1
    assert set(res["demo"]["stage_seconds"]) >= {"sft", "rl"}
