"""`tirl export --out` never deletes what it did not write: not the checkpoint it exports, not foreign files."""

from conftest import make_model
from tirl import rundir
from tirl.cli import main
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
    (out / "stale.txt").write_text("")  # anything in an earlier export is the export's own
    assert main(["export", str(tmp_path / "ckpt"), "--out", str(out)]) == 0
    assert not (out / "stale.txt").exists() and (out / "config.json").is_file()
    assert not [
        p for p in tmp_path.iterdir() if p.name.startswith(".")
    ]  # no staging directory left beside it
