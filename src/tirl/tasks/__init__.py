"""Tasks: a dataset, its tools, its verifier, its prompt wording and its `task.*` options (`task.py`), and the
ones tirl ships: `gsm8k` (GSM8K with stitched SFT trajectories from `stitch.py`) and `arith`, the demo's arithmetic,
a plugin that lives in `tirl.demo` and is registered here by name only."""

from tirl.tasks import gsm8k  # noqa: F401  (registers the gsm8k task)
from tirl.tasks.task import DemoData, Task, TaskOptions, load_task, register_task, task_names

register_task("tirl.demo.arith_task:ARITH", name="arith")

__all__ = ["DemoData", "Task", "TaskOptions", "load_task", "register_task", "task_names"]
