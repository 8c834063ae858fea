"""Checkpoints are trusted only after checking: content hashes, finite tensors, the run's stage and settings, and a
save that fails in the OS says why in one line and leaves the earlier checkpoints as they were."""

import errno
import json

import pytest
import torch

from conftest import make_model
from tirl.train import checkpoint_read, checkpoint_write, manifest
from tirl.train.manifest import CheckpointError, RunIdentity

RL = RunIdentity("rl", {"data": "8 rows, sha256 0123", "rl.n": 8, "rl.prompts_per_step": 4})


@pytest.fixture
def model(tokenizer):
    return make_model(tokenizer)


def _save(path, model, tokenizer, identity=RL, state=None, optimizer=None):
    return checkpoint_write.save(
        path, model=model, tokenizer=tokenizer, state=state or {"step": 1, "order": [0]}, optimizer=optimizer,
        identity=identity,
    )  # fmt: skip


def test_overwritten_bytes_of_the_same_size_are_found_by_the_hash(model, tokenizer, tmp_path):
    path = _save(tmp_path / "checkpoint-1", model, tokenizer)
    for name in (checkpoint_write.STATE, "model.safetensors"):
        f = path / name
        good = f.read_bytes()
        mid = len(good) // 2
        f.write_bytes(good[:mid] + b"\xff" * 4096 + good[mid + 4096 :])  # same size, other content
        with pytest.raises(CheckpointError, match=f"{name} is damaged \\(its sha256 differs"):
            checkpoint_read.load_state(path, RL)
        f.write_bytes(good)
    assert checkpoint_read.load_state(path, RL)["step"] == 1


def test_manifest_lists_size_and_hash_and_identity(model, tokenizer, tmp_path):
    path = _save(tmp_path / "checkpoint-1", model, tokenizer)
    data = json.loads((path / manifest.MANIFEST).read_text())
    entry = data["files"]["model.safetensors"]
    assert entry["size"] == (path / "model.safetensors").stat().st_size
    assert entry["sha256"] == manifest.file_hash(path / "model.safetensors")
    assert data["stage"] == "rl" and data["settings"] == dict(RL.settings)


def test_a_manifest_of_sizes_only_still_loads(model, tokenizer, tmp_path):
    path = _save(tmp_path / "checkpoint-1", model, tokenizer, identity=None)
    data = json.loads((path / manifest.MANIFEST).read_text())
    (path / manifest.MANIFEST).write_text(
        json.dumps({"files": {k: v["size"] for k, v in data["files"].items()}})
    )
    assert checkpoint_read.load_state(path, RL)["step"] == 1  # no settings recorded: nothing to compare


def test_non_finite_weights_or_optimizer_state_are_not_saved(model, tokenizer, tmp_path):
    opt = torch.optim.AdamW(model.parameters())
    model(torch.tensor([[1, 2, 3]])).logits.sum().backward()
    opt.step()
    name, p = next(iter(model.named_parameters()))
    with torch.no_grad():
        opt.state[p]["exp_avg"][0] = float("nan")
    with pytest.raises(CheckpointError, match=f"optimizer state 'exp_avg' of {name} holds NaN or infinite"):
        _save(tmp_path / "checkpoint-1", model, tokenizer, optimizer=opt)
    with torch.no_grad():
        p[0] = float("inf")
    with pytest.raises(CheckpointError, match=f"weight {name} holds NaN or infinite"):
        _save(tmp_path / "checkpoint-1", model, tokenizer, optimizer=opt)
    assert list(tmp_path.iterdir()) == []


def test_resume_refuses_another_stage(model, tokenizer, tmp_path):
    sft = _save(tmp_path / "sft", model, tokenizer, RunIdentity("sft", {}), state={"step": 1})
    with pytest.raises(CheckpointError, match="written by tirl sft, not tirl rl: resume it with `tirl sft"):
        checkpoint_read.load_state(sft, RL)
    rl = _save(tmp_path / "rl", model, tokenizer)
    with pytest.raises(CheckpointError, match="written by tirl rl, not tirl sft"):
        checkpoint_read.load_state(rl, RunIdentity("sft", {}, allow_changes=True))  # never overridable


def test_a_checkpoint_without_a_recorded_stage_is_told_by_its_state(model, tokenizer, tmp_path):
    rl = _save(tmp_path / "rl", model, tokenizer, identity=None)  # the RL trainer's state has a data order
    with pytest.raises(CheckpointError, match="written by tirl rl, not tirl sft"):
        checkpoint_read.load_state(rl, RunIdentity("sft", {}))
    sft = _save(tmp_path / "sft", model, tokenizer, identity=None, state={"step": 1})
    with pytest.raises(CheckpointError, match="written by tirl sft, not tirl rl"):
        checkpoint_read.load_state(sft, RL)


def test_changed_settings_are_refused_naming_both_values_unless_allowed(model, tokenizer, tmp_path, capsys):
    path = _save(tmp_path / "checkpoint-1", model, tokenizer)
    other = RunIdentity("rl", {**RL.settings, "rl.n": 4, "data": "32 rows, sha256 4567"})
    with pytest.raises(CheckpointError) as e:
        checkpoint_read.load_state(path, other)
    msg = str(e.value)
    assert "data: '8 rows, sha256 0123' in the checkpoint, '32 rows, sha256 4567' now" in msg
    assert "rl.n: 8 in the checkpoint, 4 now" in msg and "--resume-allow-changes" in msg
    allowed = RunIdentity("rl", other.settings, allow_changes=True)
    assert checkpoint_read.load_state(path, allowed)["step"] == 1
    assert "rl.n: 8 in the checkpoint, 4 now" in capsys.readouterr().out


@pytest.mark.parametrize(
    "error, said",
    [
        (OSError(errno.ENOSPC, "No space left on device"), "no space left on the disk"),
        (OSError(errno.EIO, "Input/output error"), "the write failed: Input/output error"),
        (RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 1 vs 0: file write failed"),
         "file write failed"),
    ],
)  # fmt: skip
def test_a_failed_save_says_why_in_one_line_and_keeps_the_earlier_checkpoint(
    model, tokenizer, tmp_path, monkeypatch, error, said
):
    first = _save(tmp_path / "checkpoint-1", model, tokenizer)
    real = torch.save

    def failing(obj, f, *a, **kw):
        real(obj, f, *a, **kw)  # a partial file is written, then the disk gives out
        raise error

    monkeypatch.setattr(checkpoint_write.torch, "save", failing)
    with pytest.raises(CheckpointError) as e:
        _save(tmp_path / "checkpoint-2", model, tokenizer)
    msg = str(e.value)
    assert said in msg and "\n" not in msg and "earlier ones are intact" in msg
    monkeypatch.setattr(checkpoint_write.torch, "save", real)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-1"]  # the partial one is gone
    assert checkpoint_read.load_state(first, RL)["step"] == 1


def test_data_fingerprint_sees_content_and_order():
    a, b = {"prompt": "1+1"}, {"prompt": "2+2"}
    assert manifest.data_fingerprint([a, b]) == manifest.data_fingerprint([dict(a), dict(b)])
    assert manifest.data_fingerprint([a, b]) != manifest.data_fingerprint([b, a])
    assert manifest.data_fingerprint([a]).startswith("1 rows, sha256 ")


def test_the_commands_refuse_the_other_stages_checkpoint_and_changed_data(model, tokenizer, tmp_path, capsys):
    from conftest import sample_conversation
    from tirl.cli import main
    from tirl.tasks.arith.problems import generate_problems

    rl_data, sft_data = tmp_path / "rl.jsonl", tmp_path / "sft.jsonl"
    rows = [p.to_row() for p in generate_problems(8, seed=3)]
    rl_data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    sft_data.write_text(json.dumps({"messages": sample_conversation()}) + "\n")
    sft = _save(tmp_path / "sft-ckpt", model, tokenizer, RunIdentity("sft", {}), state={"step": 1})
    common = [
        f"model.path={tmp_path}",
        f"rl.data={rl_data}",
        f"sft.data={sft_data}",
        "rl.n=8",
        "rl.prompts_per_step=4",
    ]
    assert main(["rl", *common, "--out", str(tmp_path / "rl"), "--resume", str(sft)]) == 2
    assert "written by tirl sft, not tirl rl" in capsys.readouterr().err
    override = ["--resume", str(sft), "--resume-allow-changes"]  # settings may change, the stage never
    assert main(["rl", *common, "--out", str(tmp_path / "rl"), *override]) == 2
    assert "written by tirl sft, not tirl rl" in capsys.readouterr().err
    rl = _save(tmp_path / "rl-ckpt", model, tokenizer)
    assert main(["sft", *common, "--out", str(tmp_path / "sft"), "--resume", str(rl)]) == 2
    assert "written by tirl rl, not tirl sft" in capsys.readouterr().err
    assert main(["rl", *common, "--out", str(tmp_path / "rl"), "--resume", str(rl)]) == 2
    err = capsys.readouterr().err
    assert (
        "data: '8 rows, sha256 0123' in the checkpoint, '8 rows, sha256 " in err
    )  # the data's real fingerprint


def test_torchs_bare_unexpected_pos_on_a_full_disk_is_called_a_full_disk(
    model, tokenizer, tmp_path, monkeypatch
):
    """What a real 3 MB tmpfs gave: torch's writer says only "unexpected pos"; the free space tells the cause."""
    import collections

    first = _save(tmp_path / "checkpoint-1", model, tokenizer)

    def full(obj, f, *a, **kw):
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 110336 vs 110224")

    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(checkpoint_write.torch, "save", full)
    monkeypatch.setattr(manifest.shutil, "disk_usage", lambda _: usage(3 << 20, 3 << 20, 430_080))
    with pytest.raises(CheckpointError, match=r"not saved: no space left on the disk \(430,080 bytes free\)"):
        _save(tmp_path / "checkpoint-2", model, tokenizer)
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-1"]
    assert checkpoint_read.load_state(first, RL)
