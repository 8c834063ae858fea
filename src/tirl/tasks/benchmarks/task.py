"""The evaluation benchmarks as tasks, each named as `task=NAME` and `tirl data prepare NAME` name it: aime24,
aime25, amc23, math500 and humaneval ship their files (`files/`); gpqa and livecodebench read the user's copy of
the published file (`--source`), which tirl does not ship (license).

Each task lists the code tool and names its verifier with the data sources the reward registry routes to it
(`tirl.rewards.registry`: `MATH_SOURCES`, `INTEGER_SOURCES`, `CHOICE_SOURCES`, `CODE_SOURCES`), the tuple itself,
not a copy: rewards grades these rows with no task loaded, and registering a task changes no route.
`prepare(wording, split)` is `tirl data prepare NAME`; `rows(split, options, seed)` serves a run without a data
file (`tirl eval task=math500`): the test split in the recipe's wording, the rows `tirl data prepare NAME` writes.
A benchmark has only a test split, so "train" is an error naming it. A task not packaged says what file it reads
(`Task.user_file`): its `prepare` takes the path (`source`, None when `--source` is missing), and a run takes
its rows from `eval.data`.

Deliberately not here: `task.*` options (a benchmark is its whole test split, in file order) and a train split.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tirl.rewards.registry import CHOICE_SOURCES, CODE, CODE_SOURCES, INTEGER_SOURCES, MATH_SOURCES
from tirl.tasks.benchmarks.data import (
    prepare_aime24,
    prepare_aime25,
    prepare_amc23,
    prepare_gpqa,
    prepare_humaneval,
    prepare_livecodebench,
    prepare_math500,
)
from tirl.tasks.task import Task, TaskOptions, register_task

Reader = Callable[..., list[dict[str, Any]]]
WORDING = "recipe"  # a run's rows without a data file: `tirl data prepare NAME`'s default wording


def _test_only(name: str, split: str) -> None:
    if split != "test":
        raise ValueError(f"{name} has only a test split: it is an evaluation benchmark, with no train split")


def _no_train(name: str, split: str) -> None:
    if split == "train":
        raise ValueError(f"{name} is an evaluation benchmark with no train split: set rl.data=FILE to train")


def prepare_packaged(name: str, read: Reader, wording: str, split: str) -> list[dict[str, Any]]:
    """`tirl data prepare NAME`: the packaged test split in `wording`."""
    _test_only(name, split)
    return read(wording)


def packaged_rows(
    name: str, read: Reader, split: str, options: TaskOptions, seed: int
) -> list[dict[str, Any]]:
    """A run's rows without a data file: the test split in the recipe's wording."""
    _no_train(name, split)
    return read(WORDING)


def prepare_user_file(
    name: str, read: Reader, hub: str, wording: str, split: str, source: str | Path | None = None
) -> list[dict[str, Any]]:
    """`tirl data prepare NAME --source FILE`: the user's copy of the published file as rows in `wording`."""
    _test_only(name, split)
    if source is None:
        raise ValueError(
            f"{name} is not packaged (license): pass --source FILE, the published file, or prepare {hub}, "
            "the recipe's copy fetched from the Hugging Face Hub"
        )
    if not Path(source).is_file():
        raise FileNotFoundError(f"source file {str(source)!r} does not exist")
    return read(wording, source)


def user_file_rows(name: str, hub: str, split: str, options: TaskOptions, seed: int) -> list[dict[str, Any]]:
    """None of its own: the error says how to write the file a run reads."""
    _no_train(name, split)
    raise ValueError(
        f"{name} is not packaged (license): set eval.data=FILE, written by `tirl data prepare {name} --source "
        f"PUBLISHED_FILE --out FILE` or `tirl data prepare {hub} --out FILE`"
    )


def packaged(name: str, read: Reader, verifier: str, data_sources: Sequence[str]) -> Task:
    """A benchmark whose files ship in `files/`."""
    return Task(
        name,
        verifier=verifier,
        data_sources=data_sources,
        rows=functools.partial(packaged_rows, name, read),
        prepare=functools.partial(prepare_packaged, name, read),
    )


def user_supplied(
    name: str, read: Reader, verifier: str, data_sources: Sequence[str], *, user_file: str, hub: str
) -> Task:
    """A benchmark read from the user's file (`user_file` says which, for `--help`); `hub` is the recipe's copy
    `tirl data prepare` fetches instead (`tirl.data.hub.HUB_SETS`)."""
    return Task(
        name,
        verifier=verifier,
        data_sources=data_sources,
        rows=functools.partial(user_file_rows, name, hub),
        prepare=functools.partial(prepare_user_file, name, read, hub),
        user_file=user_file,
    )


BENCHMARKS = (
    packaged("aime24", prepare_aime24, "integer", INTEGER_SOURCES),
    packaged("aime25", prepare_aime25, "integer", INTEGER_SOURCES),
    packaged("amc23", prepare_amc23, "integer", INTEGER_SOURCES),
    packaged("math500", prepare_math500, "math", MATH_SOURCES),
    packaged("humaneval", prepare_humaneval, CODE, CODE_SOURCES),
    user_supplied(
        "gpqa", prepare_gpqa, "choice", CHOICE_SOURCES, user_file="GPQA's CSV", hub="open-agentrl-gpqa"
    ),
    user_supplied(
        "livecodebench", prepare_livecodebench, CODE, CODE_SOURCES, user_file="the Open-AgentRL parquet",
        hub="open-agentrl-lcb-v6",
    ),
)  # fmt: skip
for _task in BENCHMARKS:
    register_task(_task)
