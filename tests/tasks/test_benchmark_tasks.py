"""Every evaluation benchmark is a task (`tirl.tasks.benchmarks`): its rows for a run without a data file are what
`tirl data prepare NAME` writes, it has no train split, and its verifier and data sources are the reward registry's
own routes, so registering it changes none."""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tirl.data.hub import HUB_SETS
from tirl.rewards.registry import verifier_name
from tirl.tasks import TaskOptions, load_task
from tirl.tasks.benchmarks import BENCHMARKS

PACKAGED = ("aime24", "aime25", "amc23", "math500", "humaneval")
USER_SUPPLIED = ("gpqa", "livecodebench")


def test_the_benchmarks_are_registered_tasks():
    assert sorted(t.name for t in BENCHMARKS) == sorted(PACKAGED + USER_SUPPLIED)
    assert {n: bool(load_task(n).user_file) for n in PACKAGED + USER_SUPPLIED} == {
        **dict.fromkeys(PACKAGED, False),
        **dict.fromkeys(USER_SUPPLIED, True),
    }


@pytest.mark.parametrize("name", PACKAGED)
def test_a_runs_test_rows_are_the_prepared_rows_in_the_recipes_wording(name):
    task = load_task(name)
    rows = task.load_rows("test", TaskOptions(name=name), seed=0)
    assert rows == task.prepare("recipe", "test")
    assert rows != task.prepare("plain", "test")
    assert rows == load_task(name).load_rows("test", TaskOptions(name=name), seed=7)  # no draw by seed


@pytest.mark.parametrize("name", PACKAGED + USER_SUPPLIED)
def test_a_benchmark_has_no_train_split(name):
    task = load_task(name)
    with pytest.raises(
        ValueError, match=f"^{name} is an evaluation benchmark with no train split: set rl.data"
    ):
        task.load_rows("train", TaskOptions(name=name), seed=0)
    with pytest.raises(ValueError, match=f"^{name} has only a test split: it is an evaluation benchmark"):
        task.prepare("recipe", "train")


@pytest.mark.parametrize("name", USER_SUPPLIED)
def test_a_benchmark_not_packaged_asks_for_its_file(name):
    task = load_task(name)
    with pytest.raises(
        ValueError, match=f"^{name} is not packaged .*set eval.data=FILE.*tirl data prepare {name}"
    ):
        task.load_rows("test", TaskOptions(name=name), seed=0)
    with pytest.raises(ValueError, match="pass --source FILE") as raised:
        task.prepare("recipe", "test", None)
    hub = str(raised.value).split("or prepare ")[1].split(",")[0]
    assert hub in HUB_SETS  # the recipe's copy it names is one `tirl data prepare` fetches


def _user_rows(name, tmp_path):
    if name == "gpqa":
        path = tmp_path / "gpqa_diamond.csv"
        with open(path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(
                [
                    "Question",
                    "Correct Answer",
                    "Incorrect Answer 1",
                    "Incorrect Answer 2",
                    "Incorrect Answer 3",
                ]
            )
            w.writerow(["Which is a noble gas?", "Neon", "Iron", "Sodium", "Carbon"])
    else:
        path = tmp_path / "lcb.parquet"
        truth = json.dumps({"ground_truth": json.dumps({"inputs": ["1\n"], "outputs": ["1\n"]})})
        row = {"data_source": "LiveCodeBench_v6", "prompt": [{"role": "user", "content": "Echo."}]}
        pq.write_table(pa.Table.from_pylist([{**row, "reward_model": truth}]), path)
    return load_task(name).prepare("recipe", "test", str(path))


@pytest.mark.parametrize("name", PACKAGED + USER_SUPPLIED)
def test_every_row_is_graded_by_its_tasks_verifier(name, tmp_path):
    task = load_task(name)
    rows = _user_rows(name, tmp_path) if task.user_file else task.prepare("recipe", "test")
    assert rows
    for row in rows:
        assert row["data_source"].lower() in task.data_sources
        assert verifier_name(row["data_source"], row["ability"]) == task.verifier


def test_registering_the_benchmarks_changes_no_route():
    """The routes the reward registry holds on its own are the ones every benchmark task declares."""
    code = (
        "import sys, tirl.rewards.registry as r\n"
        "assert 'tirl.tasks' not in sys.modules\n"
        "alone = dict(r._SOURCES)\n"
        "from tirl.tasks.benchmarks import BENCHMARKS\n"
        "print(all(alone[s] == t.verifier for t in BENCHMARKS for s in t.data_sources))\n"
        "print(all(r._SOURCES[k] == v for k, v in alone.items()))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["True", "True"]


def test_an_eval_without_a_data_file_reads_the_benchmarks_rows():
    """`tirl eval task=math500` with no eval.data: the stage asks the task for its test rows."""
    from tirl.commands.run_config import TirlConfig
    from tirl.commands.stages import task_rows
    from tirl.core.config import load_config

    cfg = load_config(TirlConfig, None, ["task.name=math500"])
    assert task_rows(cfg, "", "test") == load_task("math500").prepare("recipe", "test")
    with pytest.raises(ValueError, match="^math500 is an evaluation benchmark with no train split"):
        task_rows(cfg, "", "train")
