"""A run directory never misleads a resume: what a killed save left is removed, a checkpoint holds only what its
manifest lists, a fresh run never mixes its steps with an earlier run's, and non-finite values never reach
metrics.jsonl as bare NaN, a checkpoint, the final model or an export.

The runs are `tirl sft` on the tiny test model, in this process (a few seconds each); the killed save is a real
SIGKILL of a process caught inside `checkpoint_write.save`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from conftest import make_model, say_rows
from tirl.cli import main
from tirl.core.logging import MetricsLogger
from tirl.tasks.arith.problems import generate_problems
from tirl.train import checkpoint_read, checkpoint_write, manifest, run_outputs
from tirl.train.manifest import CheckpointError
from tirl.train.optim import NonFiniteError
from tirl.train.sft import SFTConfig, SFTTrainer, sft_run

SRC = Path(__file__).resolve().parents[2] / "src"


@pytest.fixture(scope="module")
def setup(tokenizer, tmp_path_factory):
    """A tiny model directory and 16 SFT rows."""
    root = tmp_path_factory.mktemp("safety")
    model = make_model(tokenizer)
    model.save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "model")
    rows = say_rows(16)
    (root / "sft.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def _sft(root: Path, out: Path, *extra: str) -> int:
    """`tirl sft`: 16 rows in batches of 8, two epochs (4 steps), a checkpoint every 2 steps."""
    return main([
        "sft", f"model.path={root / 'model'}", f"sft.data={root / 'sft.jsonl'}", "sft.epochs=2", "sft.batch_size=8",
        "sft.save_every=2", "threads=1", "logging.backends=[jsonl]", *extra, "--out", str(out),
    ])  # fmt: skip


def _strict_rows(path: Path) -> list[dict]:
    """JSON lines parsed strictly: a bare NaN or Infinity is an error, as in jq or JavaScript."""

    def refuse(name: str):
        raise ValueError(f"not JSON: {name}")

    return [json.loads(line, parse_constant=refuse) for line in path.read_text().splitlines()]


# 18: what a save killed midway leaves


KILLED_SAVE = """
import sys, time, torch
sys.path.insert(0, sys.argv[2])
from conftest import build_test_tokenizer, make_model
from tirl.train import checkpoint_write
tok = build_test_tokenizer()
model = make_model(tok)
real = torch.save
def stuck(obj, f, *a, **kw):
    real(obj, f, *a, **kw)
    print("staged", flush=True)
    time.sleep(600)  # killed here: the weights and the state are in the stage, the manifest is not
torch.save = stuck
checkpoint_write.save(sys.argv[1] + "/checkpoint-2", model=model, tokenizer=tok, state={"step": 2})
"""


def test_a_save_killed_midway_is_removed_by_the_next_run(setup, tmp_path, capsys):
    out = tmp_path / "run"
    assert _sft(setup, out) == 0  # a finished run with checkpoint-2 and checkpoint-4
    capsys.readouterr()
    tests = Path(__file__).resolve().parents[1]
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_SAVE, str(out), str(tests)], stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(SRC), "CUDA_VISIBLE_DEVICES": ""},
    )  # fmt: skip
    try:
        assert proc.stdout.readline().strip() == "staged"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    (staged,) = out.glob(".checkpoint-2.*.tmp")
    assert (staged / "model.safetensors").is_file() and not (staged / manifest.MANIFEST).exists()
    lookalikes = [
        ".checkpoint-2.tmp",
        ".checkpoint-2.notes.tmp",
        "checkpoint-2.abcd1234.tmp",
        ".mine.abcd1234.tmp",
    ]
    for name in lookalikes:  # not tirl's staging names: never touched
        (out / name).write_text("mine")
    assert _sft(setup, out, "--resume", "auto") == 0
    said = capsys.readouterr().out
    assert f"removed what a killed save left in {out}: {staged.name}" in said
    assert not staged.exists()
    assert all((out / name).read_text() == "mine" for name in lookalikes)
    assert [p.name for p in run_outputs.complete_checkpoints(out)] == ["checkpoint-2", "checkpoint-4"]


def test_clean_staging_puts_back_a_copy_set_aside_whose_replacement_never_arrived(tmp_path):
    (tmp_path / ".checkpoint-4.old").mkdir()  # killed between atomic_dir's two renames: the only copy
    (tmp_path / ".checkpoint-4.old" / manifest.MANIFEST).write_text('{"files": {}}')
    (tmp_path / "model").mkdir()
    (tmp_path / ".model.old").mkdir()  # the new model arrived: the old one is left over
    (tmp_path / ".metrics.jsonl.k3_9xq2a.tmp").write_text('{"step": 0')
    assert run_outputs.clean_staging(tmp_path) == [".metrics.jsonl.k3_9xq2a.tmp", ".model.old"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-4", "model"]
    assert [p.name for p in run_outputs.complete_checkpoints(tmp_path)] == ["checkpoint-4"]


# 19: files a manifest does not list


def test_an_unlisted_file_in_a_checkpoint_is_refused_and_never_loaded(tokenizer, tmp_path):
    model = make_model(tokenizer)
    path = checkpoint_write.save(
        tmp_path / "checkpoint-1", model=model, tokenizer=tokenizer, state={"step": 1}
    )
    (path / "NOTES.md").write_text("lr looked high here\n")  # notes: allowed, never loaded
    assert checkpoint_read.load_state(path)["step"] == 1
    other = {k: torch.full_like(v, 0.5) for k, v in make_model(tokenizer, seed=1).state_dict().items()}
    save_file({k: v.contiguous() for k, v in other.items() if k != "lm_head.weight"}, path / "zz.safetensors")
    with pytest.raises(CheckpointError, match=r"zz.safetensors is not in its manifest.json \(added after"):
        checkpoint_read.load_state(path)
    with pytest.raises(CheckpointError, match="zz.safetensors is not in its manifest.json"):
        checkpoint_read.verify(path, hashes=False)  # what --resume DIR checks first
    fresh = make_model(tokenizer, seed=2)
    checkpoint_read.load_weights(fresh, path)  # even when asked directly, only the listed weights are read
    saved = load_file(path / "model.safetensors")
    assert all(torch.equal(fresh.state_dict()[k], v) for k, v in saved.items())
    (path / "dcp").mkdir()
    (path / "dcp" / "__0_0.distcp").write_bytes(b"\0" * 8)  # anywhere in the checkpoint
    (path / "zz.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"dcp/__0_0.distcp is not in its manifest"):
        checkpoint_read.load_state(path)


# 20: a fresh run into a directory holding an earlier run


def test_a_fresh_run_into_an_earlier_runs_directory_is_refused_or_restarted(setup, tmp_path, capsys):
    out = tmp_path / "run"
    assert _sft(setup, out) == 0
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir() if p.name != ".tirl-lock"}
    metrics = (out / "metrics.jsonl").read_text()
    capsys.readouterr()
    assert _sft(setup, out, "sft.epochs=1", "sft.optim.lr=0.1") == 2  # no --resume: refused, nothing changed
    err = capsys.readouterr().err
    assert (
        f"--out {out} holds an earlier tirl sft run (checkpoint-2, checkpoint-4, model, metrics.jsonl)" in err
    )
    assert "continue it with --resume auto, start over there with --restart (deletes them)" in err
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir() if p.name != ".tirl-lock"} == before
    assert (out / "metrics.jsonl").read_text() == metrics
    assert _sft(setup, out, "--resume", "auto", "--restart") == 2
    assert "--restart starts over and --resume auto continues: choose one" in capsys.readouterr().err
    assert _sft(setup, out, "sft.epochs=1", "sft.save_every=1", "--restart") == 0
    assert (
        "deleted the earlier run's checkpoint-2, checkpoint-4, model, metrics.jsonl"
        in capsys.readouterr().out
    )
    assert [p.name for p in run_outputs.complete_checkpoints(out)] == ["checkpoint-1", "checkpoint-2"]
    assert [r["step"] for r in _strict_rows(out / "metrics.jsonl")] == [0, 1]
    assert checkpoint_read.load_state(run_outputs.resolve_resume("auto", out))["step"] == 2  # the new run's


def test_resume_auto_without_a_checkpoint_starts_over_without_duplicating_steps(setup, tmp_path, capsys):
    out = tmp_path / "run"
    assert _sft(setup, out, "sft.save_every=0") == 0  # an attempt that never wrote a checkpoint
    assert _sft(setup, out, "sft.save_every=0", "--resume", "auto") == 0
    assert "no complete checkpoint" in capsys.readouterr().out
    assert [r["step"] for r in _strict_rows(out / "metrics.jsonl")] == [0, 1, 2, 3]


def test_a_fresh_rl_run_is_refused_before_anything_loads(tmp_path, capsys):
    """The issue's case: `tirl rl` again into its own directory without --resume (checked before the sandbox)."""
    out = tmp_path / "rl"
    (out / "checkpoint-3").mkdir(parents=True)
    (out / "checkpoint-3" / manifest.MANIFEST).write_text('{"files": {}}')
    (out / "metrics.jsonl").write_text('{"step": 0}\n')
    (out / ".tirl-run.json").write_text('{"command": "rl"}')
    rows = [p.to_row() for p in generate_problems(4, seed=3)]
    (tmp_path / "rl.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = ["rl", f"model.path={tmp_path}", f"rl.data={tmp_path / 'rl.jsonl'}", "--out", str(out)]
    assert main(args) == 2
    assert (
        f"--out {out} holds an earlier tirl rl run (checkpoint-3, metrics.jsonl)" in capsys.readouterr().err
    )
    assert sorted(p.name for p in out.iterdir()) == [
        ".tirl-lock",
        ".tirl-run.json",
        "checkpoint-3",
        "metrics.jsonl",
    ]


# 21: non-finite values


def test_metrics_are_strict_json_with_non_finite_values_as_null(tmp_path):
    logger = MetricsLogger(tmp_path, backends=["jsonl"])
    logger.log({"loss": float("nan"), "grad_norm": float("inf"), "lr": 0.5, "tokens": 3}, step=0)
    logger.close()
    (row,) = _strict_rows(tmp_path / "metrics.jsonl")
    assert (row["loss"], row["grad_norm"], row["lr"], row["tokens"]) == (None, None, 0.5, 3)


def test_a_diverged_sft_run_stops_naming_the_step_and_writes_no_final_model(setup, tmp_path, capsys):
    """lr=1e9: step 0's update leaves weights that give a NaN loss at step 1 (its update is skipped); that was the
    last step, so the run used to end there and write those weights as its final model."""
    out = tmp_path / "run"
    assert _sft(setup, out, "sft.epochs=1", "sft.save_every=0", "sft.optim.lr=1e9") == 2
    err = capsys.readouterr().err
    assert (
        "SFT step 1: the loss or gradient norm went non-finite" in err
        and "final model was not written" in err
    )
    assert not (out / "model").exists()
    rows = _strict_rows(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1] and rows[1]["sft/loss"] is None


class PoisonedAt(SFTTrainer):
    """An SFT trainer whose update at step `at` leaves a NaN in a weight (as an overflowing update would)."""

    at = 1

    def step(self, step: int) -> dict[str, float]:
        metrics = super().step(step)
        if step == self.at:
            with torch.no_grad():
                self.model.model.layers[0].mlp.up_proj.weight[0, 0] = float("nan")
        return metrics


def test_weights_that_go_non_finite_stop_the_run_at_that_step(tokenizer, renderer, tmp_path):
    from conftest import sample_conversation

    rows = [{"messages": sample_conversation()}] * 8
    cfg = SFTConfig(epochs=2, batch_size=2, save_every=1, optim=SFTConfig().optim)
    trainer = PoisonedAt(
        sft_run(make_model(tokenizer), renderer, rows, cfg, pad_id=renderer.pad_id, seed=0, out_dir=tmp_path)
    )
    with pytest.raises(
        NonFiniteError, match=r"SFT step 1: weight model.layers.0.mlp.up_proj.weight holds NaN"
    ):
        trainer.train()
    assert [p.name for p in run_outputs.complete_checkpoints(tmp_path)] == [
        "checkpoint-1"
    ]  # the last good one


def test_all_finite_sees_nan_and_infinity_in_any_tensor():
    ok = [torch.ones(3), torch.zeros(2, 2, dtype=torch.bfloat16), torch.full((4,), 3e38)]
    assert manifest.all_finite(ok)
    for bad in (float("nan"), float("inf"), -float("inf")):
        t = torch.ones(5)
        t[3] = bad
        assert not manifest.all_finite([*ok, t])
    assert manifest.all_finite([torch.ones(2, dtype=torch.long) * 2**40])  # integers: nothing to check


def test_export_refuses_non_finite_weights(tokenizer, tmp_path):
    from tirl.models.export import export_checkpoint

    model = make_model(tokenizer)
    with torch.no_grad():
        model.model.norm.weight[1] = float("nan")
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    with pytest.raises(
        ValueError, match=r"weight model.norm.weight holds NaN or infinite values, so it is not"
    ):
        export_checkpoint(tmp_path / "model", tmp_path / "export")
    assert not (tmp_path / "export").exists()


def test_resuming_an_earlier_checkpoint_beside_later_ones_is_refused(setup, tmp_path, capsys):
    """20 (the branch case): `--resume OUT/checkpoint-2` while OUT holds checkpoint-4 would leave the abandoned
    run's checkpoint-4 for a later `--resume auto`."""
    out = tmp_path / "run"
    assert _sft(setup, out) == 0
    capsys.readouterr()
    assert _sft(setup, out, "--resume", str(out / "checkpoint-2")) == 2
    err = capsys.readouterr().err
    assert "also holds later checkpoints of the run (checkpoint-4)" in err
    assert (out / "checkpoint-4").is_dir()
