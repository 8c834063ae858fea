"""`tirl export --out` never deletes what it did not write: not the checkpoint it exports, not foreign files."""

import os
import shutil
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import make_model
from tirl.cli import main
from tirl.core import rundir
from tirl.models.loading import save_checkpoint


def test_export_into_the_checkpoints_parent_is_refused_and_deletes_nothing(tokenizer, tmp_path, capsys):
    run = tmp_path / "x"
    save_checkpoint(make_model(tokenizer), tokenizer, run / "ckpt")
    (run / "keep.txt").write_text("k")
    assert main(["export", str(run / "ckpt"), "--out", str(run)]) == 2
    assert "is the checkpoint itself or a directory holding it" in capsys.readouterr().err
    assert (run / "keep.txt").read_text() == "k" and (run / "ckpt" / "model.safetensors").is_file()


def test_export_into_a_foreign_directory_is_refused(tokenizer, tmp_path, capsys):
    save_checkpoint(make_model(tokenizer), tokenizer, tmp_path / "ckpt")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.md").write_text("n")
    assert main(["export", str(tmp_path / "ckpt"), "--out", str(tmp_path / "other")]) == 2
    assert "not a tirl export directory (it holds notes.md)" in capsys.readouterr().err
    assert (tmp_path / "other" / "notes.md").read_text() == "n"


def test_an_earlier_export_is_replaced_whole(tokenizer, tmp_path):
    save_checkpoint(make_model(tokenizer), tokenizer, tmp_path / "ckpt")
    out = tmp_path / "out"
    assert main(["export", str(tmp_path / "ckpt"), "--out", str(out)]) == 0
    assert rundir.owner(out) == "export" and (out / "model.safetensors").is_file()
    assert "model.safetensors" in rundir.recorded_files(out)  # the marker lists what the export wrote
    (out / "model.safetensors").write_bytes(b"")  # its own files are replaced, whatever happened to them
    assert main(["export", str(tmp_path / "ckpt"), "--out", str(out)]) == 0
    assert (out / "model.safetensors").stat().st_size > 0 and (out / "config.json").is_file()
    assert not [
        p for p in tmp_path.iterdir() if p.name.startswith(".")
    ]  # no staging directory left beside it


def test_an_export_holding_notes_and_an_eval_is_not_replaced(tokenizer, tmp_path, capsys):
    """export A, add NOTES.md and an eval inside, export B: refused, naming them; nothing is lost."""
    save_checkpoint(make_model(tokenizer, seed=0), tokenizer, tmp_path / "a")
    save_checkpoint(make_model(tokenizer, seed=1), tokenizer, tmp_path / "b")
    out = tmp_path / "e1"
    assert main(["export", str(tmp_path / "a"), "--out", str(out)]) == 0
    weights_a = (out / "model.safetensors").read_bytes()
    (out / "NOTES.md").write_text("model A: lr 1e-3")
    (out / "eval-final").mkdir()
    (out / "eval-final" / "records.jsonl").write_text("{}\n")
    assert main(["export", str(tmp_path / "b"), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert (
        f"--out {out} is an earlier export that now also holds what the export did not write (NOTES.md, "
        in err
    )
    assert "eval-final)" in err and "choose another --out, or move them out first" in err
    assert (out / "NOTES.md").read_text() == "model A: lr 1e-3" and (
        out / "eval-final" / "records.jsonl"
    ).is_file()
    assert (out / "model.safetensors").read_bytes() == weights_a
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    (out / "NOTES.md").unlink()
    shutil.rmtree(out / "eval-final")
    assert main(["export", str(tmp_path / "b"), "--out", str(out)]) == 0
    assert (out / "model.safetensors").read_bytes() != weights_a


def test_an_export_marked_before_markers_listed_files_keeps_a_users_files(tokenizer, tmp_path, capsys):
    save_checkpoint(make_model(tokenizer), tokenizer, tmp_path / "ckpt")
    out = tmp_path / "out"
    assert main(["export", str(tmp_path / "ckpt"), "--out", str(out)]) == 0
    (out / rundir.MARKER).write_text('{"command": "export"}')  # as an older tirl wrote it
    assert main(["export", str(tmp_path / "ckpt"), "--out", str(out)]) == 0  # HF files are an export's own
    (out / "NOTES.md").write_text("n")
    assert main(["export", str(tmp_path / "ckpt"), "--out", str(out)]) == 2
    assert "(NOTES.md)" in capsys.readouterr().err and (out / "NOTES.md").read_text() == "n"


@pytest.mark.parametrize("mask, mode", [(0o022, 0o644), (0o002, 0o664)], ids=["umask022", "umask002"])
def test_exported_weights_get_the_umasks_mode_like_the_other_files(tokenizer, tmp_path, mask, mode):
    save_checkpoint(make_model(tokenizer), tokenizer, tmp_path / "ckpt")
    old = os.umask(mask)
    try:
        assert main(["export", str(tmp_path / "ckpt"), "--out", str(tmp_path / "out")]) == 0
    finally:
        os.umask(old)
    for name in ("model.safetensors", "config.json", rundir.MARKER):
        assert stat.S_IMODE((tmp_path / "out" / name).stat().st_mode) == mode, name
    assert stat.S_IMODE((tmp_path / "out").stat().st_mode) == 0o777 & ~mask


def test_export_into_the_checkpoint_itself_is_refused(tokenizer, tmp_path, capsys):
    ckpt = tmp_path / "ckpt"
    save_checkpoint(make_model(tokenizer), tokenizer, ckpt)
    before = sorted(p.name for p in ckpt.iterdir())
    assert main(["export", str(ckpt), "--out", str(ckpt / "sub")]) == 2
    assert f"--out {ckpt / 'sub'} is inside the checkpoint {ckpt}" in capsys.readouterr().err
    assert sorted(p.name for p in ckpt.iterdir()) == before


def test_what_a_killed_export_staged_is_cleared_by_the_next_one(tokenizer, tmp_path):
    save_checkpoint(make_model(tokenizer), tokenizer, tmp_path / "ckpt")
    code = (
        "import os, signal, sys\nfrom tirl.core import io\n"
        "with io.atomic_dir(sys.argv[1]) as stage:\n"
        " (stage / 'model.safetensors').write_bytes(b'w' * 4096)\n"
        " os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
    killed = subprocess.run([sys.executable, "-c", code, str(tmp_path / "exp")], env=env)
    assert killed.returncode == -signal.SIGKILL
    assert len([p for p in tmp_path.iterdir() if p.name.startswith(".exp.")]) == 1
    (tmp_path / ".exp.abcd1234.tmp").mkdir()  # not a name tirl's staging gives: kept
    assert main(["export", str(tmp_path / "ckpt"), "--out", str(tmp_path / "exp")]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == [".exp.abcd1234.tmp", "ckpt", "exp"]
