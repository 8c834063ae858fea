"""Which verifier grades a row is declared once, when a task is registered: loading a task never changes it, and two
tasks that send one data source to different verifiers are an error."""

from __future__ import annotations

import subprocess
import sys

import pytest

import tirl.rewards.registry as registry
import tirl.tasks.task as task_module
from tirl.rewards.registry import verifier_name
from tirl.tasks import Task, load_task, register_task


@pytest.fixture(autouse=True)
def _own_registries(monkeypatch):
    """The tasks and routes these tests register vanish with them."""
    monkeypatch.setattr(task_module, "_TASKS", dict(task_module._TASKS))
    monkeypatch.setattr(registry, "_SOURCES", dict(registry._SOURCES))


def _rows(split, options, seed):
    return []


def test_registering_a_task_routes_its_sources_at_once():
    register_task(Task("routing-a", tools=(), verifier="integer", data_sources=("routing/a",), rows=_rows))
    assert verifier_name("routing/a") == "integer"  # before any load


def test_a_second_task_sending_a_source_elsewhere_is_refused():
    register_task(Task("routing-b", tools=(), verifier="integer", data_sources=("routing/b",), rows=_rows))
    with pytest.raises(
        ValueError, match="'routing/b' is graded by verifier 'integer'; task 'routing-c' sends it"
    ):
        register_task(Task("routing-c", tools=(), verifier="choice", data_sources=("routing/b",), rows=_rows))
    assert verifier_name("routing/b") == "integer"
    # the same route twice (a task and its variant) is fine
    register_task(Task("routing-d", tools=(), verifier="integer", data_sources=("routing/b",), rows=_rows))


def test_loading_tasks_in_any_order_grades_gsm8k_rows_the_same():
    before = verifier_name("gsm8k")
    for name in ("gsm8k-fewshot", "arith", "gsm8k-no-tool", "gsm8k"):
        load_task(name)
        assert verifier_name("gsm8k") == before == "gsm8k"


def test_the_gsm8k_tasks_are_graded_without_loading_one():
    code = "import tirl.tasks, tirl.rewards.registry as r; print(r.verifier_name('openai/gsm8k'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "gsm8k"
