"""arith, the default task, every part of it in this folder: generated arithmetic problems (`problems.py`), the
scripted solver that writes SFT trajectories through the sandbox (`solver.py`), the copy warm-up rows a model built
from scratch starts on (`warmup.py`) and the task with its options (`task.py`). Importing the package registers it."""

from tirl.tasks.arith.problems import STYLES, Problem, split_problems
from tirl.tasks.arith.solver import SolverConfig, scripted_trajectories
from tirl.tasks.arith.task import ARITH, ArithOptions, arith_rows, arith_training_data
from tirl.tasks.arith.warmup import copy_warmup_rows

__all__ = [
    "ARITH",
    "STYLES",
    "ArithOptions",
    "Problem",
    "SolverConfig",
    "arith_training_data",
    "arith_rows",
    "copy_warmup_rows",
    "scripted_trajectories",
    "split_problems",
]
