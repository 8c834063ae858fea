"""Hostile and careless inputs end in one line naming what to fix, exit 2, never a traceback (`tirl.cli.main`): a
full disk under safetensors' writer, weights or config.json that cannot be read, JSONL nested past the recursion
limit or holding a lone surrogate, a tool call of the wrong type, a rollout server that died, and a thread count or
seed no library takes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from safetensors import SafetensorError

import tirl.commands.models
import tirl.commands.plan
from conftest import make_model
from tirl.cli import main
from tirl.commands.run_config import TirlConfig
from tirl.core.config import ConfigError, load_config
from tirl.data.readers import read_dataset
from tirl.data.schema import RowError
from tirl.rollout.engines.openai.engine import EngineGone

DEEP = 100_000  # brackets: far past the recursion limit json.loads reads to
OK_ROW = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}


def _one_line_error(capsys: pytest.CaptureFixture[str], command: str) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    [line] = [x for x in err.splitlines() if x.strip()]
    assert line.startswith(f"tirl {command}: error: ")
    return line


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, tokenizer) -> Path:
    out = tmp_path_factory.mktemp("model")
    make_model(tokenizer).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture()
def tokenizer_dir(tmp_path, tokenizer) -> Path:
    out = tmp_path / "tok"
    tokenizer.save_pretrained(out)
    return out


def _jsonl(path: Path, *lines: str) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def test_safetensors_running_out_of_space_is_one_line_naming_the_output(monkeypatch, capsys, tmp_path):
    def full(*args, **kwargs):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(tirl.commands.models, "export_command", lambda args: full())
    assert main(["export", "ckpt", "--out", str(tmp_path / "out")]) == 2
    line = _one_line_error(capsys, "export")
    assert f"{tmp_path / 'out'}: No space left on device (ENOSPC)" in line


def test_exporting_truncated_weights_is_one_line_naming_the_checkpoint(model_dir, tmp_path, capsys):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    for f in model_dir.iterdir():
        (ckpt / f.name).write_bytes(f.read_bytes())
    weights = ckpt / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    assert main(["export", str(ckpt), "--out", str(tmp_path / "out")]) == 2
    line = _one_line_error(capsys, "export")
    assert f"model.path '{ckpt}': its model cannot be loaded" in line and "truncated" in line


def test_plan_with_a_config_json_nested_too_deeply_is_one_line(tmp_path, capsys):
    arch = tmp_path / "config.json"
    arch.write_text('{"model_type": "qwen2", "x": ' + "[" * DEEP + "]" * DEEP + "}")
    assert main(["plan", "--arch", str(arch)]) == 2
    assert f"--arch {arch}: not a config.json (nested too deeply to read)" in _one_line_error(capsys, "plan")


def test_check_tokens_with_a_config_json_that_is_not_json_is_one_line(tokenizer_dir, tmp_path, capsys):
    (tokenizer_dir / "config.json").write_text("not json {")
    rows = _jsonl(tmp_path / "rows.jsonl", json.dumps(OK_ROW))
    assert main(["check-tokens", str(rows), "--model", str(tokenizer_dir)]) == 2
    assert "its tokenizer cannot be loaded" in _one_line_error(capsys, "check-tokens")


DEEP_ROW = '{"messages": ' + "[" * DEEP + "]" * DEEP + "}"
SURROGATE_ROW = (
    '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "a\\ud800b"}]}'
)


def test_a_jsonl_row_nested_past_the_recursion_limit_is_a_row_error_naming_it(tmp_path):
    path = _jsonl(tmp_path / "rows.jsonl", json.dumps(OK_ROW), DEEP_ROW)
    with pytest.raises(RowError, match=re.escape(f"{path}: row 2: nested too deeply to read")):
        read_dataset(path)  # what sft, rl and eval read their rows with


def test_a_lone_surrogate_is_a_row_error_naming_its_column(tmp_path):
    path = _jsonl(tmp_path / "rows.jsonl", SURROGATE_ROW)
    with pytest.raises(
        RowError, match=re.escape(f"{path}: row 1, column 'messages[1].content': holds a lone")
    ):
        read_dataset(path)


def test_a_surrogate_pair_is_text(tmp_path):
    pair = SURROGATE_ROW.replace("\\ud800", "\\ud83d\\ude00")
    rows, _ = read_dataset(_jsonl(tmp_path / "rows.jsonl", pair))
    assert rows[0]["messages"][1]["content"] == "a\U0001f600b"


@pytest.mark.parametrize("row", [DEEP_ROW, SURROGATE_ROW], ids=["nested", "surrogate"])
def test_check_tokens_names_the_row_it_cannot_read(row, tokenizer_dir, tmp_path, capsys):
    path = _jsonl(tmp_path / "rows.jsonl", row)
    assert main(["check-tokens", str(path), "--model", str(tokenizer_dir)]) == 2
    assert f"{path}: row 1" in _one_line_error(capsys, "check-tokens")


@pytest.mark.parametrize("row", [DEEP_ROW, SURROGATE_ROW], ids=["nested", "surrogate"])
def test_data_inspect_lists_the_row_it_cannot_read_as_invalid(row, tokenizer_dir, tmp_path, capsys):
    path = _jsonl(tmp_path / "rows.jsonl", json.dumps(OK_ROW), row)
    assert main(["data", "inspect", str(path), "--model", str(tokenizer_dir), "--format", "chatml"]) == 1
    out = capsys.readouterr().out
    assert "1 invalid rows" in out and f"{path}: row 2" in " ".join(out.split())


def test_check_tokens_names_the_column_of_a_tool_call_list_that_is_a_string(tokenizer_dir, tmp_path, capsys):
    row = {
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "", "tool_calls": "zzz"},
        ]
    }
    path = _jsonl(tmp_path / "rows.jsonl", json.dumps(row))
    assert main(["check-tokens", str(path), "--model", str(tokenizer_dir)]) == 2
    assert (
        "row 1, column 'messages[1].tool_calls': expected a list of tool calls, got str"
        in _one_line_error(capsys, "check-tokens")
    )


def test_check_tokens_names_a_trajectory_of_the_wrong_shape(tokenizer_dir, tmp_path, capsys):
    prompt = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "", "tool_calls": "zzz"},
              {"role": "user", "content": "and?"}]  # fmt: skip
    row = {"prompt_ids": [1], "response_ids": [2], "loss_mask": [1], "meta": {"prompt": prompt}}
    path = _jsonl(tmp_path / "rows.jsonl", json.dumps(row))
    assert main(["check-tokens", str(path), "--model", str(tokenizer_dir)]) == 2
    assert "row 1: not a trajectory as tirl writes one" in _one_line_error(capsys, "check-tokens")


def test_a_rollout_server_that_died_is_its_message_alone(monkeypatch, capsys):
    why = "the vLLM server exited with code -9 (killed); its log: runs/x/vllm.log"

    def dead(args):
        raise EngineGone(why)

    monkeypatch.setattr(tirl.commands.plan, "plan_command", dead)
    assert main(["plan"]) == 2
    assert _one_line_error(capsys, "plan").startswith(f"tirl plan: error: {why}")


@pytest.mark.parametrize(
    "override, message",
    [
        ("threads=1000000", "threads must be <= 1024 (0 = all cores), got 1000000"),
        (f"seed={2**70}", f"seed must be within 0..{2**32 - 1} (2**32 - 1), got {2**70}"),
        ("seed=-1", f"seed must be within 0..{2**32 - 1} (2**32 - 1), got -1"),
    ],
)
def test_a_thread_count_or_seed_no_library_takes_is_refused_naming_its_key(override, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(TirlConfig, None, [override])
