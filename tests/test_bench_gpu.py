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
    for name, row in importlib.import_module("bench.gpu_update").update(cfg, dims, "cpu")["variants"].items():
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
    upd = importlib.import_module("bench.gpu_update").update(cfg, dims, "cpu", profile=True)["variants"]
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


def recipe():
    return importlib.import_module("bench.gpu_recipe")


def test_recipe_decode_memory_arithmetic_on_the_4b_shape():
    """The 4B: 147,456 bytes of bf16 keys and values a position. Batch 64 with 16,384 positions fits an 80 GB card
    in no variant; with 2,048 every variant fits: the CUDA-graph engine's peak is its arena, the pre-fill's own
    cache beside it (bf16 keys too) and two copies of the weights (fp32 and the graphs' bf16 copy; no autocast
    cache under the graphs)."""
    r = recipe()
    cfg = r.recipe_config(small=False)
    counts = r.param_counts(cfg)
    assert r.kv_bytes_per_position(cfg) == 36 * 8 * 128 * 2 * 2 == 147_456
    assert 4.0e9 < counts["params"] < 4.1e9
    long = r.decode_need(cfg, counts, 16384, 64, 64)
    assert not any(r.fits(v["total"], r.CARD_80GB_GIB) for v in long.values())
    short = r.decode_need(cfg, counts, 2048, 64, 64)
    assert all(r.fits(v["total"], r.CARD_80GB_GIB) for v in short.values())
    graphs = short[r.GRAPHS]
    assert "autocast_weight_cache" not in graphs and "autocast_weight_cache" in short[r.EAGER]
    assert graphs["prefill_cache"] == pytest.approx(64 * 2048 * 147_456 / r.GIB)
    assert graphs["arena"] > 64 * 2112 * 147_456 / r.GIB  # a capacity of columns(2,112) = 2,560 positions
    assert graphs["total"] == pytest.approx(sum(v for k, v in graphs.items() if k != "total"))


def test_recipe_decode_runs_the_largest_power_of_two_batch_that_fits():
    r = recipe()
    cfg = r.recipe_config(small=False)
    counts = r.param_counts(cfg)
    both = [r.GRAPHS, r.HF]
    h100, h200 = r.CARD_80GB_GIB, 139.8
    assert [r.batch_to_run(cfg, counts, c, 64, 64, h100, both) for c in (2048, 16384)] == [64, 8]
    assert [r.batch_to_run(cfg, counts, c, 64, 64, h200, both) for c in (2048, 16384)] == [64, 16]
    assert r.batch_to_run(cfg, counts, 16384, 64, 64, h100, [r.HF]) == 16  # HF alone fits twice the rows
    assert r.batch_to_run(cfg, counts, 2048, 64, 64, 20.0, both) == 0  # not even one row
    for batch in (8, 16):  # what it returns fits; twice as much does not
        need = r.decode_need(cfg, counts, 16384, 64, batch)
        assert r.fits(need[r.GRAPHS]["total"], h100) == (batch == 8)


def test_recipe_update_is_skipped_where_tirl_plan_says_it_does_not_fit():
    """A card smaller than tirl plan's estimate (even with activation checkpointing): both variants are skipped
    with the estimate, nothing is built; the 4B's update needs checkpointing on an 80 GB card, or 4 FSDP
    processes without it."""
    r = recipe()
    out = r.update_4b("cpu", small=True, card_gib=0.01)
    assert out["activation_checkpointing"] is None
    for row in out["variants"].values():
        assert row["skipped"].startswith("tirl plan estimates ") and row["skipped"].endswith(
            " GiB > 0.0 GiB on this card"
        )
    cfg = r.recipe_config(small=False)
    plans = {c: r.recipe_plan(cfg, r.UPDATE_FULL, "cuda", r.CARD_80GB_GIB, c) for c in (False, True)}
    assert plans[False].total_gib > r.CARD_80GB_GIB >= plans[True].total_gib
    assert r.fsdp_80gb(cfg, r.UPDATE_FULL)["processes"] == 4


def test_a_guarded_variant_records_an_out_of_memory_error_and_the_part_goes_on():
    def oom() -> dict:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    assert importlib.import_module("bench.gpu").guarded(oom, "cpu") == {
        "error": "OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB"
    }


def test_recipe_decode_runs_at_the_tiny_shape_on_cpu():
    """On a CPU the graph row says why it is skipped; the eager engine and HF `generate` give a finite step time
    at each context, at the batch asked (the tiny shape fits)."""
    import math

    out = recipe().decode_4b("cpu", small=True)
    assert list(out["contexts"]) == ["32", "128"] and out["bandwidth"]["tb_per_s"] is None
    for ctx in out["contexts"].values():
        assert ctx["batch_run"] == ctx["batch_asked"] == 4
        rows = ctx["variants"]
        assert rows[recipe().GRAPHS] == "skipped: CUDA graphs need CUDA"
        for name in (recipe().EAGER, recipe().HF):
            row = rows[name]
            assert row["step_ms"] > 0 and math.isfinite(row["decode_tokens_per_s"]), (name, row)
            assert math.isfinite(row["vs_hf_generate"])
        assert (
            rows[recipe().EAGER]["compute"] == "bfloat16 autocast"
            and rows[recipe().HF]["weights"] == "bfloat16"
        )


def test_recipe_update_runs_at_the_tiny_shape_on_cpu():
    import math

    out = recipe().update_4b("cpu", small=True)
    assert out["activation_checkpointing"] is False and out["real_tokens"] > 3 * 4 * 128 // 4
    for name, row in out["variants"].items():
        assert (row["params"], row["optimizer_state"], row["compute"]) == (
            "float32",
            "float32",
            "bfloat16 autocast",
        )
        assert math.isfinite(row["tokens_per_s"]) and row["tflop_per_s"] > 0, name
    assert (
        out["tirl_plan_estimate"]["without_checkpointing"]["total_gib"] > 0 and out["fsdp_80gb"]["processes"]
    )


def test_the_before_row_decodes_with_the_full_scan_draw_and_puts_the_engines_back():
    """The graph row's "before" twin runs the engine with bench/sampler.py's full-scan draw (on a CPU through the
    eager engine: the graph row itself is skipped there), and the engine's own draw is back afterwards."""
    from bench.sampler import old_draw

    import tirl.rollout.sampling as sampling

    gpu = importlib.import_module("bench.gpu")
    kept, seen = sampling.draw, []
    with gpu.sampler("full-scan"):
        seen.append(sampling.draw)
    assert seen == [old_draw] and sampling.draw is kept
    with pytest.raises(ValueError, match="unknown sampler"), gpu.sampler("radix"):
        pass
    cfg, dims = gpu.model_config(small=True), {**gpu.SMALL, "new": 3}
    ids = torch.randint(1, cfg.vocab_size - 1, (2, 5), generator=torch.Generator().manual_seed(0))
    kw = {"compute_dtype": "bfloat16", "sampler": "full-scan"}
    row = gpu.decode_row(cfg, dims, "cpu", ids, "float32", kw)
    assert row["tokens"] > 0 and row["compute"] == "bfloat16 autocast" and sampling.draw is kept
    assert gpu.decode_row(cfg, dims, "cpu", ids, "float32", {**kw, "cuda_graphs": "on"}).startswith("skipped")


def test_decode_writes_each_row_as_it_ends_and_a_failed_row_costs_no_other(monkeypatch):
    """A session may kill a part in the middle: each decode row is handed to `progress` as it ends (main writes it
    to the JSON, marked partial), and a row that raises is recorded as its error while the next rows still run."""
    gpu = importlib.import_module("bench.gpu")
    seen = []
    monkeypatch.setattr(gpu, "_WRITERS", [lambda so_far: seen.append(list(so_far["variants"]))])
    row = gpu.decode_row

    def flaky(cfg, dims, device, ids, weights, kw, profile=False):
        if kw == {"compute_dtype": "bfloat16"}:
            raise RuntimeError("CUDA out of memory")
        return row(cfg, dims, device, ids, weights, kw, profile)

    monkeypatch.setattr(gpu, "decode_row", flaky)
    cfg, dims = gpu.model_config(small=True), {**gpu.SMALL, "new": 2}
    rows = gpu.decode(cfg, dims, "cpu")["variants"]
    names = [name for name, _, _ in gpu.DECODE]
    assert seen == [names[: i + 1] for i in range(len(names))]
    assert rows["torch engine, fp32 weights, bf16 autocast"] == {"error": "RuntimeError: CUDA out of memory"}
    assert rows["HF generate, bf16 weights"]["tokens_per_s"] > 0 and rows[names[-1]].startswith("skipped")
    assert rows["torch engine, fp32 weights, fp32"]["vs_hf_generate_bf16"] > 0


def test_the_compiled_update_runs_after_the_others_and_names_its_compiles(monkeypatch):
    """The update's third variant is tirl's with `model.compile_layers` (on a CPU through aot_eager): it runs
    last, each variant reaches `progress` as it ends, and it names the padded shapes it compiled (its warm-up
    update compiles them) beside the same fields as the others."""
    upd = importlib.import_module("bench.gpu_update")
    gpu = importlib.import_module("bench.gpu")
    seen = []
    monkeypatch.setattr(gpu, "_WRITERS", [lambda so_far: seen.append(list(so_far["variants"]))])
    cfg, dims = gpu.model_config(small=True), gpu.SMALL
    rows = upd.update(cfg, dims, "cpu")["variants"]
    assert seen == [["tirl"], ["tirl", "plain HF"], ["tirl", "plain HF", upd.COMPILED]]
    compiled = rows[upd.COMPILED]
    assert compiled["compiled_shapes"] and all(t % dims["seq"] == 0 for _, t in compiled["compiled_shapes"])
    assert compiled["tokens_per_s"] > 0 and compiled["warmup_s"] > 0 and compiled["speed_vs_plain"] > 0
    assert "compiled_shapes" not in rows["tirl"]
