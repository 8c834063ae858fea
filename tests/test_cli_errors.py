"""What a user can fix outside tirl fails as one line naming it, with a non-zero exit and no traceback: a full disk
(or a file too large, a path not writable, a name too long) under any command, a model.device this machine lacks,
a `task=` path that is not a task, a vLLM server that does not start. Each failure is planted: a writer that raises
OSError(ENOSPC), torch without CUDA, a fake vLLM Python that exits at once."""

from __future__ import annotations

import errno
import json
import os
from contextlib import nullcontext
from pathlib import Path

import pytest

import tirl.commands.data
import tirl.data
import tirl.eval.evaluate
import tirl.models.export
import tirl.sandbox
import tirl.tasks.gsm8k.stitch
from conftest import make_model
from tirl.cli import main
from tirl.tasks.arith.problems import generate_problems


def one_line(capsys) -> str:
    """The single line the command wrote to stderr (no traceback)."""
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def disk_full(*_, **__):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.fixture
def model_dir(tokenizer, tmp_path) -> Path:
    make_model(tokenizer).save_pretrained(tmp_path / "m")
    tokenizer.save_pretrained(tmp_path / "m")
    return tmp_path / "m"


@pytest.fixture
def rows_file(tmp_path) -> Path:
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps(p.to_row()) + "\n" for p in generate_problems(1, seed=0)))
    return rows


@pytest.mark.parametrize(
    "code, said",
    [
        (errno.ENOSPC, "No space left on device (ENOSPC)"),
        (errno.EFBIG, "File too large (EFBIG)"),
        (errno.EACCES, "Permission denied (EACCES)"),
        (errno.EROFS, "Read-only file system (EROFS)"),
        (errno.EDQUOT, "Disk quota exceeded (EDQUOT)"),
    ],
)
def test_data_prepare_writing_fails_as_one_line_naming_out(monkeypatch, tmp_path, capsys, code, said):
    def fails(*_, **__):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(tirl.data, "write_rows", fails)
    out = tmp_path / "gsm8k.jsonl"
    assert main(["data", "prepare", "gsm8k", "--out", str(out)]) == 2
    assert f"{out}: {said}" in one_line(capsys)


def test_a_name_too_long_for_out_is_one_line(tmp_path, capsys):
    out = tmp_path / ("a" * 300 + ".jsonl")
    assert main(["data", "prepare", "gsm8k", "--out", str(out)]) == 2
    assert "File name too long (ENAMETOOLONG)" in one_line(capsys)


def test_a_full_disk_in_data_stitch_is_one_line(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(tirl.tasks.gsm8k, "gsm8k_records", lambda split: [])
    monkeypatch.setattr(tirl.sandbox, "build_sandbox", lambda cfg: nullcontext())
    monkeypatch.setattr(
        tirl.tasks.gsm8k.stitch,
        "stitch_rows",
        lambda *a: ([{"x": 1}], tirl.tasks.gsm8k.stitch.StitchReport()),
    )
    monkeypatch.setattr(tirl.data, "write_rows", disk_full)
    out = tmp_path / "stitched.jsonl"
    assert main(["data", "stitch", "gsm8k", "--out", str(out)]) == 2
    assert f"{out}: No space left on device (ENOSPC)" in one_line(capsys)


def safetensors_disk_full(*_, **__):
    from safetensors import SafetensorError

    raise SafetensorError(
        'Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space left on device" })'
    )


@pytest.mark.parametrize("writer", [disk_full, safetensors_disk_full])
def test_a_full_disk_in_export_is_one_line(monkeypatch, model_dir, tmp_path, capsys, writer):
    monkeypatch.setattr(tirl.models.export, "export_hf", writer)
    out = tmp_path / "exported"
    assert main(["export", str(model_dir), "--out", str(out)]) == 2
    assert f"{out}: No space left on device (ENOSPC)" in one_line(capsys)


def test_a_full_disk_in_eval_leaves_no_records_without_a_summary(
    monkeypatch, model_dir, rows_file, tmp_path, capsys
):
    writes = []

    def summary_fails(path, obj, **kw):  # records and trajectories written, the summary not
        writes.append(Path(path).name)
        disk_full()

    monkeypatch.setattr(tirl.eval.evaluate, "atomic_write_json", summary_fails)
    out = tmp_path / "eval"
    args = [f"model.path={model_dir}", f"eval.data={rows_file}", "eval.n=1", "agent.max_response_tokens=4"]
    assert main(["eval", *args, "--out", str(out)]) == 2
    assert f"{out}: No space left on device (ENOSPC)" in one_line(capsys)
    assert writes  # the failure was the summary's
    assert not (out / "records.jsonl").exists() and not (out / "trajectories.jsonl").exists()
    assert not [p.name for p in out.iterdir() if "staged" in p.name]


@pytest.mark.parametrize("command", ["sft", "rl", "eval"])
@pytest.mark.parametrize(
    "device, said",
    [
        ("cuda", "model.device=cuda: this PyTorch is built without CUDA"),
        ("banana", "model.device='banana' is not"),
    ],
)
def test_a_device_this_machine_lacks_is_one_line_naming_the_key(
    monkeypatch, model_dir, tmp_path, capsys, command, device, said
):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: False)
    out = tmp_path / "out"
    assert main([command, f"model.path={model_dir}", f"model.device={device}", "--out", str(out)]) == 2
    assert said in one_line(capsys)
    assert not out.exists()  # refused before the output directory is claimed


def test_a_task_path_to_a_function_that_is_not_a_task_is_refused_uncalled(monkeypatch, capsys):
    called = []
    monkeypatch.setattr(os, "system", lambda command="": called.append(command))
    assert main(["eval", "task=os:system"]) == 2
    assert "task 'os:system' is a function, not a tirl.tasks.Task" in one_line(capsys)
    assert called == []


def test_a_task_factory_declared_to_return_a_task_is_called(tmp_path, monkeypatch):
    from tirl.tasks import Task, load_task

    (tmp_path / "my_tasks.py").write_text(
        "from tirl.tasks import Task\n\n\ndef make() -> Task:\n    return Task('mine', rows=lambda split, options, seed: [])\n\n\n"
        "def other():\n    raise AssertionError('called')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert isinstance(load_task("my_tasks:make"), Task)
    with pytest.raises(ValueError, match="'my_tasks:other' is a function, not a tirl.tasks.Task"):
        load_task("my_tasks:other")


@pytest.fixture
def failing_vllm(tmp_path) -> list[str]:
    """rollout.* overrides for a vLLM "server" whose Python prints an error and exits 3 at once."""
    python = tmp_path / "vllm-python"
    python.write_text('#!/bin/sh\necho "ValueError: no room for the KV cache, say" >&2\nexit 3\n')
    python.chmod(0o755)
    return ["rollout.engine=vllm", f"rollout.vllm.python={python}", "rollout.vllm.startup_timeout_s=60"]


def test_vllm_failing_to_start_in_data_sample_is_one_line_naming_its_log(
    model_dir, rows_file, failing_vllm, tmp_path, capsys
):
    out = tmp_path / "sampled.jsonl"
    argv = [
        "data",
        "sample",
        f"model.path={model_dir}",
        *failing_vllm,
        "--data",
        str(rows_file),
        "--out",
        str(out),
    ]
    assert main(argv) == 2
    line = one_line(capsys)
    assert (
        "vLLM did not start" in line and "exited with code 3" in line and "no room for the KV cache" in line
    )
    assert "vllm-server.log" in line


def test_vllm_failing_to_start_in_the_demo_is_one_line_naming_its_log(
    monkeypatch, model_dir, failing_vllm, tmp_path, capsys
):
    import tirl.demo.smollm2 as smollm2
    import tirl.demo.stages as stages
    import tirl.demo.tiny as tiny

    rows = [p.to_row() for p in generate_problems(2, seed=0)]
    monkeypatch.setattr(smollm2, "ensure_smollm2", lambda path: model_dir)
    monkeypatch.setattr(stages, "run_sft", lambda cfg, out, **kw: model_dir)  # RL starts the engine first
    monkeypatch.setattr(tiny, "demo_rows", lambda cfg, out: stages.DemoRows([], rows, rows, []))
    argv = [
        "demo",
        "--model",
        "smollm2",
        f"out_dir={tmp_path / 'demo'}",
        *failing_vllm,
        "model.autocast=none",
    ]
    assert main(argv) == 2
    line = one_line(capsys)
    assert "vLLM did not start" in line and "vllm-server.log" in line
