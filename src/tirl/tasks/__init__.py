"""Tasks: a dataset, its tools, its verifier, its prompt wording and its `task.*` options (`task.py`). A dataset
tirl ships is one folder, a subpackage imported (and so registered) here by discovery: `gsm8k/` (GSM8K: its data,
verifier, splits, stitched SFT rows, the no-tool and few-shot variants), `arith/` (the default task:
generated arithmetic, its scripted solver) and `benchmarks/` (the evaluation benchmarks, one task each);
`verifiers_env/` names the task source `verifiers:ENV`, an environment of the `verifiers` package."""

import importlib
import pkgutil

from tirl.tasks.task import (
    Task,
    TaskOptions,
    TrainingData,
    load_task,
    prepared_tasks,
    register_task,
    task_names,
)

for _found in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
    if _found.ispkg:  # a dataset's folder registers its tasks when imported
        importlib.import_module(f"{__name__}.{_found.name}")

__all__ = [
    "TrainingData",
    "Task",
    "TaskOptions",
    "load_task",
    "prepared_tasks",
    "register_task",
    "task_names",
]
