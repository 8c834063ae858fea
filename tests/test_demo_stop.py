"""A stop request (SIGTERM, Ctrl-C) during any demo ends `tirl demo` with one line naming the checkpoint and the
exit code of every stage command's stop (75, `EXIT_RESUMABLE`), never a traceback."""

from __future__ import annotations

import pytest

from tirl.cli import main
from tirl.train.signals import EXIT_RESUMABLE, StopRequested


def _stop(*_args, **_kw):
    raise StopRequested("runs/x/sft-code/checkpoint-2", 2)


@pytest.mark.parametrize(
    ("target", "argv"),
    [
        ("tirl.demo.gsm8k_study.run_gsm8k_study", ["--model", "smollm2", "--task", "gsm8k", "--study"]),
        ("tirl.demo.smollm2.run_smollm2_demo", ["--model", "smollm2"]),
        ("tirl.demo.tiny.run_demo", []),
    ],
)
def test_a_stopped_demo_exits_resumable_with_one_line(monkeypatch, tmp_path, capsys, target, argv) -> None:
    monkeypatch.setattr(target, _stop)
    assert main(["demo", *argv, f"out_dir={tmp_path / 'run'}"]) == EXIT_RESUMABLE
    err = capsys.readouterr().err
    assert err.startswith(
        "tirl demo: stopped on request after step 2; checkpoint runs/x/sft-code/checkpoint-2"
    )
    assert "Traceback" not in err
