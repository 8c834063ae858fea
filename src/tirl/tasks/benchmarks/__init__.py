"""The evaluation benchmarks, each a task (`task=math500`, `tirl data prepare math500`): their packaged files and
the reading of the user's GPQA CSV (`data.py`, `files/` with their provenance in `files/SOURCE.md`) and the tasks
with their verifiers (`task.py`). Importing the package registers the seven tasks: aime24, aime25, amc23, math500,
humaneval, gpqa and livecodebench.

One folder for all seven: they share one shape (one test split, no options, the recipe's wording or a plain one,
a verifier of the reward registry's own) and one provenance table, so a benchmark is a reader and one line of
`task.py`'s `BENCHMARKS`."""

from tirl.tasks.benchmarks.data import (
    FILES,
    prepare_aime24,
    prepare_aime25,
    prepare_amc23,
    prepare_gpqa,
    prepare_humaneval,
    prepare_livecodebench,
    prepare_math500,
)
from tirl.tasks.benchmarks.task import BENCHMARKS

__all__ = [
    "BENCHMARKS",
    "FILES",
    "prepare_aime24",
    "prepare_aime25",
    "prepare_amc23",
    "prepare_gpqa",
    "prepare_humaneval",
    "prepare_livecodebench",
    "prepare_math500",
]
