"""Exact resume: a run killed after checkpoint k and resumed with --resume auto matches an uninterrupted run.

Every run is a real `python -m tirl rl` subprocess on a tiny model the test saves; the kill is SIGKILL, sent as soon
as the checkpoint's manifest appears (the run may already be inside the next step, whose logged metrics the resumed
run must drop). Comparisons are to the bit: same machine, same thread count.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conftest import make_model, say_rows
from tirl.tasks.arith.problems import generate_problems
from tirl.train import checkpoint_read, checkpoint_write, manifest, run_outputs

SRC = Path(__file__).resolve().parents[2] / "src"


@pytest.fixture(scope="module")
def setup(tokenizer, tmp_path_factory):
    root = tmp_path_factory.mktemp("resume")
    model = make_model(tokenizer)
    model.save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "model")
    rows = [p.to_row() for p in generate_problems(8, seed=3)]
    (root / "rl.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def _args(root: Path, out: Path, kl: float, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "tirl",
        "rl",
        f"model.path={root / 'model'}",
        f"rl.data={root / 'rl.jsonl'}",
        "rl.steps=4",
        "rl.prompts_per_step=4",  # 8 rows: the prompt data's epoch ends after steps 2 and 4
        "rl.n=4",
        "rl.mini_batch_size=8",  # two optimizer updates per step
        "rl.save_every=2",
        f"rl.kl.coef={kl}",
        "rl.optim.lr=0.01",
        "agent.max_response_tokens=24",
        "agent.max_tokens_per_turn=24",
        "reward.overlong=true",  # lengths vary, so rewards and advantages do
        "reward.overlong_buffer=16",
        "threads=1",
        "logging.backends=[jsonl]",
        "--out",
        str(out),
        *extra,
    ]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(SRC), "TIRL_QUIET": "1", "CUDA_VISIBLE_DEVICES": ""}


def _run(args: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(args, env=_env(), capture_output=True, text=True, timeout=300, **kw)


def _metrics(out: Path) -> list[dict]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [
        {k: v for k, v in r.items() if not k.startswith(("time", "perf/"))} for r in rows
    ]  # clocks differ


def _kill_after_checkpoint(args: list[str], ckpt: Path) -> None:
    proc = subprocess.Popen(args, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 300
    while not (ckpt / manifest.MANIFEST).exists():
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        assert time.time() < deadline
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)


@pytest.mark.slow
@pytest.mark.parametrize("kl", [0.0, 0.5], ids=["no-kl", "kl-reference"])
def test_killed_and_resumed_run_matches_an_uninterrupted_one(setup, tmp_path, kl):
    full, cut = tmp_path / "full", tmp_path / "cut"
    r = _run(_args(setup, full, kl))
    assert r.returncode == 0, r.stderr[-2000:]
    _kill_after_checkpoint(_args(setup, cut, kl), cut / "checkpoint-2")  # at an epoch boundary of the prompts
    r = _run(_args(setup, cut, kl, "--resume", "auto"))
    assert r.returncode == 0, r.stderr[-2000:]
    assert "resuming from" in r.stdout and "at step 2 of 4" in r.stdout
    a, b = _metrics(full), _metrics(cut)
    assert [m["step"] for m in b] == [0, 1, 2, 3]  # nothing duplicated, nothing missing
    assert a == b  # every metric, to the bit
    if kl:
        assert all(m["loss/kl"] > 0 for m in a[1:])  # the reference really differs from the policy
    wa, wb = load_file(full / "model" / "model.safetensors"), load_file(cut / "model" / "model.safetensors")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.slow
def test_sigterm_finishes_the_step_and_leaves_a_resumable_checkpoint(setup, tmp_path):
    out = tmp_path / "term"
    proc = subprocess.Popen(
        _args(setup, out, 0.0), env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.time() + 300
    while not (out / "metrics.jsonl").exists() or not (out / "metrics.jsonl").read_text().strip():
        assert proc.poll() is None and time.time() < deadline
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    stdout, _ = proc.communicate(timeout=120)
    assert proc.returncode == 75, stdout  # EX_TEMPFAIL: stopped on request, resumable
    assert "--resume auto" in stdout
    (ckpt,) = run_outputs.complete_checkpoints(out)
    checkpoint_read.verify(ckpt)
    step = checkpoint_read.load_state(ckpt)["step"]
    assert 1 <= step < 4
    r = _run(_args(setup, out, 0.0, "--resume", "auto"))
    assert r.returncode == 0 and (out / "model" / "config.json").is_file(), r.stderr[-2000:]
    assert [m["step"] for m in _metrics(out)] == [0, 1, 2, 3]


def test_rotation_never_deletes_the_newest_complete_checkpoint(tmp_path):
    for step in (2, 4, 6):
        (tmp_path / f"checkpoint-{step}").mkdir()
        (tmp_path / f"checkpoint-{step}" / manifest.MANIFEST).write_text('{"files": {}}')
    (tmp_path / "checkpoint-8").mkdir()  # incomplete: no manifest; never counted, never deleted
    assert run_outputs.rotate(tmp_path, 0) == []
    assert [p.name for p in run_outputs.rotate(tmp_path, 2)] == ["checkpoint-2"]
    assert [p.name for p in run_outputs.complete_checkpoints(tmp_path)] == ["checkpoint-4", "checkpoint-6"]
    run_outputs.rotate(tmp_path, 1)
    assert [p.name for p in run_outputs.complete_checkpoints(tmp_path)] == ["checkpoint-6"]
    assert (tmp_path / "checkpoint-8").is_dir()
    assert run_outputs.resolve_resume("auto", tmp_path).name == "checkpoint-6"
    assert run_outputs.resolve_resume("auto", tmp_path / "nothing-here") is None


def test_damaged_checkpoints_are_named(tokenizer, tmp_path):
    model = make_model(tokenizer)
    path = checkpoint_write.save(
        tmp_path / "checkpoint-1", model=model, tokenizer=tokenizer, state={"step": 1}
    )
    assert checkpoint_read.load_state(path)["step"] == 1
    state_file = path / checkpoint_write.STATE
    state_file.write_bytes(state_file.read_bytes()[:-10])
    with pytest.raises(manifest.CheckpointError, match="trainer_state.pt is damaged"):
        checkpoint_read.load_state(path)
    checkpoint_write.save(tmp_path / "checkpoint-2", model=model, tokenizer=tokenizer, state={"step": 2})
    (tmp_path / "checkpoint-2" / "model.safetensors").unlink()
    with pytest.raises(manifest.CheckpointError, match="model.safetensors is missing"):
        run_outputs.resolve_resume(str(tmp_path / "checkpoint-2"), tmp_path)
    with pytest.raises(manifest.CheckpointError, match="no such checkpoint"):
        run_outputs.resolve_resume(str(tmp_path / "checkpoint-9"), tmp_path)


@pytest.mark.slow
def test_sft_killed_and_resumed_matches_an_uninterrupted_run(setup, tmp_path):
    rows = say_rows(40)
    (setup / "sft.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    def args(out, *extra):
        return [
            sys.executable, "-m", "tirl", "sft", f"model.path={setup / 'model'}", f"sft.data={setup / 'sft.jsonl'}",
            "sft.epochs=2", "sft.batch_size=8", "sft.save_every=3", "sft.keep_last=1", "sft.optim.lr=0.003",
            "threads=1", "logging.backends=[jsonl]", "--out", str(out), *extra,
        ]  # fmt: skip

    full, cut = tmp_path / "full", tmp_path / "cut"
    assert _run(args(full)).returncode == 0
    _kill_after_checkpoint(args(cut), cut / "checkpoint-3")
    r = _run(args(cut, "--resume", "auto"))
    assert r.returncode == 0 and "at step 3" in r.stdout, r.stderr[-2000:]
    a, b = _metrics(full), _metrics(cut)
    assert [m["step"] for m in b] == list(range(10)) and a == b
    assert [p.name for p in run_outputs.complete_checkpoints(cut)] == ["checkpoint-9"]  # keep_last=1
    wa, wb = load_file(full / "model" / "model.safetensors"), load_file(cut / "model" / "model.safetensors")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
