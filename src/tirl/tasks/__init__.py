"""Tasks: a dataset, its tools, its verifier, its prompt wording and its `task.*` options (`task.py`), and the
ones tirl ships: `gsm8k` (GSM8K with stitched SFT trajectories from `stitch.py`; `gsm8k-no-tool`, the same without
the tool, in `gsm8k.py`; `gsm8k-fewshot` in `fewshot.py`, its problems as its makers prompt a model, few-shot and
without a tool) and `arith`, the demo's arithmetic, a plugin that lives in `tirl.demo` and is registered here by
name only."""

from tirl.tasks import fewshot, gsm8k  # noqa: F401  (register the gsm8k tasks)
from tirl.tasks.task import DemoData, Task, TaskOptions, load_task, register_task, task_names

register_task("tirl.demo.arith_task:ARITH", name="arith")

__all__ = ["DemoData", "Task", "TaskOptions", "load_task", "register_task", "task_names"]
