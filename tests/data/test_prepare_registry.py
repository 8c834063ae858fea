"""`tirl data prepare` asks the task registry which datasets it offers and how to prepare them: a registered task
with data is offered with no edit to commands/, one that reads the user's file takes `--source`, and the errors for
a missing or a misplaced `--source` are the benchmark's own."""

from __future__ import annotations

import argparse

import pytest

import tirl.tasks.task as task_module
from tirl.cli import build_parser, main
from tirl.data import read_rows
from tirl.data.hub import HUB_SETS
from tirl.tasks import Task, prepared_tasks

# every name `tirl data prepare` took before the benchmarks were tasks
NAMES = (
    "aime24", "aime25", "amc23", "math500", "humaneval", "gpqa", "livecodebench", "gsm8k",
    "open-agentrl-sft-3k", "open-agentrl-30k", "open-agentrl-aime24", "open-agentrl-aime25", "open-agentrl-gpqa",
    "open-agentrl-lcb-v6",
)  # fmt: skip


@pytest.fixture(autouse=True)
def _own_tasks(monkeypatch):
    """The tasks these tests register vanish with them."""
    monkeypatch.setattr(task_module, "_TASKS", dict(task_module._TASKS))


def _prepare_parser() -> argparse.ArgumentParser:
    data = next(a for a in build_parser()._subparsers._group_actions if "data" in a.choices).choices["data"]
    return next(a for a in data._subparsers._group_actions if "prepare" in a.choices).choices["prepare"]


def _choices() -> list[str]:
    return next(a for a in _prepare_parser()._actions if a.dest == "name").choices


def _row(problem: str) -> dict:
    return {
        "data_source": "tiny_set",
        "prompt": [{"role": "user", "content": problem}],
        "ability": "math",
        "reward_model": {"ground_truth": "2", "style": "rule"},
        "extra_info": {"id": problem},
    }


def test_the_choices_are_the_registrys_and_the_hubs_and_keep_every_earlier_name():
    assert _choices() == [*prepared_tasks(), *HUB_SETS]
    assert set(NAMES) <= set(_choices())
    help_text = _prepare_parser().format_help()
    assert all(name in help_text for name in NAMES)
    assert "gpqa: GPQA's CSV; livecodebench: the Open-AgentRL" in " ".join(help_text.split())


def test_a_benchmark_left_out_of_the_registry_is_not_offered():
    del task_module._TASKS["math500"]
    assert "math500" not in _choices() and "aime24" in _choices()


def test_a_registered_task_with_data_is_prepared_with_no_edit_to_commands(tmp_path):
    def prepare(wording, split):
        return [_row(f"1+1 ({wording}, {split})")]

    task_module.register_task(Task("tiny-set", prepare=prepare))
    out = tmp_path / "tiny.jsonl"
    assert main(["data", "prepare", "tiny-set", "--wording", "plain", "--out", str(out)]) == 0
    assert read_rows(out)[0]["prompt"][0]["content"] == "1+1 (plain, test)"


def test_a_task_reading_the_users_file_takes_source(tmp_path, capsys):
    def prepare(wording, split, source):
        if source is None:
            raise ValueError("tiny-file needs --source FILE, a text file")
        return [_row(line) for line in open(source).read().split()]

    task_module.register_task(Task("tiny-file", prepare=prepare, user_file="a text file"))
    src, out = tmp_path / "problems.txt", tmp_path / "tiny.jsonl"
    src.write_text("a b\n")
    assert "tiny-file: a text file" in " ".join(_prepare_parser().format_help().split())
    assert main(["data", "prepare", "tiny-file", "--source", str(src), "--out", str(out)]) == 0
    assert [r["extra_info"]["id"] for r in read_rows(out)] == ["a", "b"]
    assert main(["data", "prepare", "tiny-file", "--out", str(tmp_path / "none.jsonl")]) == 2
    assert "tiny-file needs --source FILE, a text file" in capsys.readouterr().err
    assert main(["data", "prepare", "math500", "--source", str(src), "--out", str(tmp_path / "m.jsonl")]) == 2
    err = capsys.readouterr().err
    assert "math500 is packaged with tirl; --source is only for gpqa, livecodebench, tiny-file" in err


def test_the_source_errors_name_the_benchmark(tmp_path, capsys):
    out = str(tmp_path / "out.parquet")
    assert main(["data", "prepare", "livecodebench", "--out", out]) == 2
    assert (
        "livecodebench is not packaged (license): pass --source FILE, the published file, or prepare "
        "open-agentrl-lcb-v6, the recipe's copy fetched from the Hugging Face Hub"
    ) in capsys.readouterr().err
    assert main(["data", "prepare", "gsm8k", "--source", out, "--out", out]) == 2
    assert "gsm8k is packaged with tirl; --source is only for gpqa, livecodebench" in capsys.readouterr().err
    assert main(["data", "prepare", "gpqa", "--source", str(tmp_path / "no.csv"), "--out", out]) == 2
    assert f"source file '{tmp_path / 'no.csv'}' does not exist" in capsys.readouterr().err
    assert main(["data", "prepare", "aime25", "--split", "train", "--out", out]) == 2
    assert "aime25 has only a test split: it is an evaluation benchmark" in capsys.readouterr().err
