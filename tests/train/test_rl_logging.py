"""Validation during RL, and the logs people read: TensorBoard and an offline wandb run hold the scalars."""

import json

import pytest

from conftest import make_model
from tirl.cli import main
from tirl.tasks.arith.problems import generate_problems


@pytest.mark.slow
def test_rl_validates_and_logs_to_every_backend(tokenizer, tmp_path, monkeypatch):
    pytest.importorskip("tensorboard")
    pytest.importorskip("wandb")
    monkeypatch.setenv("TIRL_QUIET", "1")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    model = make_model(tokenizer)
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    rows = [p.to_row() for p in generate_problems(6, seed=1)]
    (tmp_path / "rl.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:4]))
    (tmp_path / "val.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[4:]))
    out = tmp_path / "run"
    code = main(
        [
            "rl",
            f"model.path={tmp_path / 'model'}",
            f"rl.data={tmp_path / 'rl.jsonl'}",
            f"rl.validation.data=[{tmp_path / 'val.jsonl'}]",
            "rl.validation.every=1",
            "eval.n=2",
            "rl.steps=2",
            "rl.prompts_per_step=2",
            "rl.n=2",
            "agent.max_response_tokens=16",
            "agent.max_tokens_per_turn=16",
            "logging.backends=[jsonl,tensorboard,wandb]",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    val = [m for m in metrics if any(k.startswith("val/") for k in m)]
    assert [m["step"] for m in val] == [0, 1] and "val/tirl/arith/pass@1" in val[0]
    train = [m for m in metrics if "reward/mean" in m]
    for key in ("perf/step_s/rollout", "perf/step_s/reward", "perf/step_s/update", "perf/step_s/sync"):
        assert all(m[key] >= 0 for m in train), key
    assert all(m["perf/tokens_per_s/update"] > 0 and m["perf/peak_rss_mb"] > 0 for m in train)
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert [s["step"] for s in samples] == [0, 1] and "<|im_start|>" in samples[0]["text"]

    # Each validation's records are an eval directory `tirl analyze` reads.
    assert main(["analyze", str(out / "eval" / "step-000001"), str(out / "eval" / "step-000002"),
                 "--labels", "s1,s2", "--out", str(tmp_path / "an"), "--no-viewer"]) == 0  # fmt: skip
    report = json.loads((tmp_path / "an" / "report.json").read_text())
    assert list(report["models"]) == ["s1", "s2"]

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(out / "tensorboard"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("reward/mean")] == [0, 1]
    assert [e.step for e in acc.Scalars("val/tirl/arith/pass@1")] == [0, 1]
    assert any("samples" in t for t in acc.Tags()["tensors"])

    (run_file,) = (out / "wandb").glob("offline-run-*/run-*.wandb")
    history = wandb_history(run_file)
    assert [h["_step"] for h in history] == [0, 1]
    assert all(
        "reward/mean" in h and "val/tirl/arith/pass@1" in h and "perf/step_s/update" in h for h in history
    )


def wandb_history(path):
    """History rows of an offline wandb run file: a LevelDB-style log (7-byte ':W&B' header, 32 KiB blocks of
    checksum/length/type-framed fragments) of protobuf `Record`s; wandb 0.31 has no Python reader for it."""
    import struct

    from wandb.proto import wandb_internal_pb2

    raw, pos, block, buf, rows = path.read_bytes(), 7, 32768, b"", []
    assert raw[:4] == b":W&B"
    while pos + 7 <= len(raw):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", raw[pos : pos + 7])
        data, pos = raw[pos + 7 : pos + 7 + length], pos + 7 + length
        buf = data if kind in (1, 2) else buf + data
        if kind in (1, 4):  # FULL, or LAST of FIRST/MIDDLE.../LAST
            rec = wandb_internal_pb2.Record()
            rec.ParseFromString(buf)
            if rec.WhichOneof("record_type") == "history":
                rows.append(
                    {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in rec.history.item}
                )
    return rows


def test_a_resumed_logger_continues_the_same_wandb_run_and_drops_later_lines(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    from tirl.core.logging import MetricsLogger

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    first = MetricsLogger(tmp_path, backends=["jsonl", "wandb"])
    for step in range(3):
        first.log({"x": float(step)}, step=step)
    run_id = first.run_id
    first.close()
    again = MetricsLogger(tmp_path, backends=["jsonl", "wandb"], resume_step=1, run_id=run_id)
    again.log({"x": 10.0}, step=1)
    again.close()
    assert again.run_id == run_id
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["x"]) for r in lines] == [(0, 0.0), (1, 10.0)]
