"""`tirl data prepare --out` never replaces an existing file unless told to with --force."""

import pytest

from tirl.cli import main
from tirl.data import read_rows


def test_an_existing_out_is_refused_without_force(tmp_path, capsys):
    out = tmp_path / "mydata.jsonl"
    out.write_text("my own rows\n")
    assert main(["data", "prepare", "aime24", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"--out {out} already exists: pass --force to replace it, or choose another --out" in err
    assert out.read_text() == "my own rows\n"
    assert main(["data", "prepare", "aime24", "--out", str(out), "--force"]) == 0
    assert len(read_rows(out)) == 30
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mydata.jsonl"]


def test_a_runs_data_file_is_kept_and_a_directory_is_refused(tmp_path, capsys):
    run = tmp_path / "demo"
    (run / "data").mkdir(parents=True)
    (run / "data" / "rl.jsonl").write_text("{}\n")
    assert main(["data", "prepare", "amc23", "--out", str(run / "data" / "rl.jsonl")]) == 2
    assert (run / "data" / "rl.jsonl").read_text() == "{}\n"
    assert main(["data", "prepare", "amc23", "--out", str(run / "data"), "--force"]) == 2
    assert f"--out {run / 'data'} is a directory: name the file to write" in capsys.readouterr().err


@pytest.mark.parametrize(
    "command, work",
    [("prepare", "tirl.tasks.benchmarks.data.read_jsonl"), ("stitch", "tirl.tasks.gsm8k.gsm8k_records")],
)
def test_an_out_without_a_rows_suffix_is_refused_before_any_work(
    tmp_path, monkeypatch, capsys, command, work
):
    def never(*_, **__):
        raise AssertionError(f"data {command} worked although --out was bad")

    monkeypatch.setattr(work, never)
    name = "aime24" if command == "prepare" else "gsm8k"
    assert main(["data", command, name, "--out", str(tmp_path / "st.txt")]) == 2
    assert f"--out {tmp_path / 'st.txt'}: cannot write rows as .txt; name it .jsonl or .parquet" in (
        capsys.readouterr().err
    )
    assert list(tmp_path.iterdir()) == []
