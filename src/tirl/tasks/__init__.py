"""Tasks: a dataset, its tools, its verifier and its prompt wording (`task.py`), and the ones tirl ships
(`builtin.py`: the demo's arithmetic task, whose generator and scripted solver live in `arith.py`, `solver.py`;
`gsm8k.py`: GSM8K with stitched SFT trajectories from `stitch.py`)."""

from tirl.tasks import builtin, gsm8k  # noqa: E402, F401  (registers the built-in tasks)
from tirl.tasks.task import DemoData, Task, load_task, register_task, task_names

__all__ = ["DemoData", "Task", "load_task", "register_task", "task_names"]
