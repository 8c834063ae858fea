"""Outputs never written through a link, and never left half-made: appends refuse a symbolic or hard link (metrics,
samples), `--force` refuses to replace a linked `--out`, and `tirl analyze` moves its outputs into place only once
all are written."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

import tirl.eval.viewer as viewer
from tirl.core.io import OutputPathError, check_output_file, open_append, staged_contents
from tirl.core.logging import MetricsLogger
from tirl.eval.report import run_analyze
from tirl.eval.tables import AnalysisConfig


def victim(tmp_path: Path) -> Path:
    path = tmp_path / "victim.txt"
    path.write_text("precious\n")
    return path


def test_an_append_through_a_symbolic_link_is_refused(tmp_path: Path) -> None:
    target = victim(tmp_path)
    (tmp_path / "log").symlink_to(target)
    with pytest.raises(OutputPathError, match=f"{tmp_path / 'log'} is a symbolic link to {target}"):
        open_append(tmp_path / "log")
    assert target.read_text() == "precious\n"


def test_an_append_through_a_dangling_link_creates_nothing(tmp_path: Path) -> None:
    (tmp_path / "log").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(OutputPathError, match="is a symbolic link"):
        open_append(tmp_path / "log")
    assert not (tmp_path / "elsewhere").exists()


def test_an_append_to_a_second_name_of_a_file_is_refused(tmp_path: Path) -> None:
    target = victim(tmp_path)
    os.link(target, tmp_path / "log")
    with pytest.raises(OutputPathError, match="has 2 hard links"):
        open_append(tmp_path / "log")
    assert target.read_text() == "precious\n"


def test_an_append_to_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "log")
    with pytest.raises(OutputPathError, match="is not a regular file"):
        open_append(tmp_path / "log")


def test_an_append_to_a_file_of_its_own_appends(tmp_path: Path) -> None:
    with open_append(tmp_path / "log") as f:
        f.write("one\n")
    with open_append(tmp_path / "log", binary=True) as f:
        f.write(b"two\n")
    assert (tmp_path / "log").read_text() == "one\ntwo\n"


def test_metrics_jsonl_that_is_a_symbolic_link_is_refused(tmp_path: Path) -> None:
    target = victim(tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").symlink_to(target)
    with pytest.raises(OutputPathError, match="metrics.jsonl is a symbolic link"):
        MetricsLogger(run, backends=["jsonl"])
    assert target.read_text() == "precious\n"


def test_samples_jsonl_that_is_a_symbolic_link_is_refused(tmp_path: Path) -> None:
    target = victim(tmp_path)
    logger = MetricsLogger(tmp_path / "run", backends=["jsonl"])
    (tmp_path / "run" / "samples.jsonl").symlink_to(target)
    with pytest.raises(OutputPathError, match="samples.jsonl is a symbolic link"):
        logger.log_text("sample", "text", step=1)
    logger.close()
    assert target.read_text() == "precious\n"


def test_a_resume_refuses_a_linked_metrics_file_before_reading_or_replacing_it(tmp_path: Path) -> None:
    target = tmp_path / "victim.jsonl"
    target.write_text(json.dumps({"step": 5}) + "\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").symlink_to(target)
    with pytest.raises(OutputPathError, match="is a symbolic link"):
        MetricsLogger(run, backends=["jsonl"], resume_step=3)
    assert (run / "metrics.jsonl").is_symlink() and target.read_text() == json.dumps({"step": 5}) + "\n"


def test_force_onto_a_symbolically_linked_out_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "real.jsonl"
    target.write_text("{}\n")
    (tmp_path / "out.jsonl").symlink_to(target)
    with pytest.raises(
        OutputPathError, match="is a symbolic link to .*real.jsonl: .*replace the link, not the file"
    ):
        check_output_file(tmp_path / "out.jsonl", force=True)
    assert (tmp_path / "out.jsonl").is_symlink() and target.read_text() == "{}\n"


def test_staged_contents_replace_files_and_whole_directories_on_success(tmp_path: Path) -> None:
    out = tmp_path / "out"
    (out / "data").mkdir(parents=True)
    (out / "data" / "stale.js").write_text("old")
    (out / "keep.txt").write_text("not ours")
    with staged_contents(out) as stage:
        (stage / "data").mkdir()
        (stage / "data" / "new.js").write_text("new")
        (stage / "report.json").write_text("{}")
    assert sorted(p.name for p in out.iterdir()) == ["data", "keep.txt", "report.json"]
    assert [p.name for p in (out / "data").iterdir()] == ["new.js"]


def test_staged_contents_leave_the_directory_as_it_was_on_failure(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "report.json").write_text("old")
    with pytest.raises(OSError), staged_contents(out) as stage:
        (stage / "report.json").write_text("new")
        raise OSError(errno.ENOSPC, "No space left on device")
    assert [p.name for p in out.iterdir()] == ["report.json"] and (out / "report.json").read_text() == "old"


def _verl_dump(tmp_path: Path) -> Path:
    rows = [
        {"input": "Q1", "output": "\\boxed{1}", "score": 1.0},
        {"input": "Q2", "output": "\\boxed{2}", "score": 0.0},
    ]
    path = tmp_path / "1.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_analyze_on_a_full_disk_leaves_no_partial_output(tmp_path: Path, monkeypatch) -> None:
    def disk_full(runs, out_dir, **kwargs):
        (Path(out_dir) / "trajectories-data").mkdir()
        (Path(out_dir) / "trajectories-data" / "chunk-0000.js").write_text("half")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(viewer, "write_viewer", disk_full)
    out = tmp_path / "analysis"
    with pytest.raises(OSError, match="No space left"):
        run_analyze([_verl_dump(tmp_path)], out, config=AnalysisConfig(num_resamples=10))
    assert list(out.iterdir()) == []  # no report.json, plots or viewer data of the failed run


def test_a_failed_analyze_keeps_the_previous_analysis_whole(tmp_path: Path, monkeypatch) -> None:
    dump, out = _verl_dump(tmp_path), tmp_path / "analysis"
    run_analyze([dump], out, config=AnalysisConfig(num_resamples=10))
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}

    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(viewer, "write_viewer", disk_full)
    with pytest.raises(OSError):
        run_analyze([dump], out, labels=["other"], config=AnalysisConfig(num_resamples=10))
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_force_onto_a_symbolically_linked_sample_summary_is_refused(tmp_path: Path) -> None:
    from tirl.commands.sample import check_outputs
    from tirl.eval.rejection_sampling import summary_path

    target = victim(tmp_path)
    out = tmp_path / "rows.jsonl"
    summary_path(out).symlink_to(target)
    with pytest.raises(OutputPathError, match="is a symbolic link to"):
        check_outputs(out, force=True)
    assert summary_path(out).is_symlink() and target.read_text() == "precious\n"
