"""Progress bars for long stages (rich), one style everywhere; TIRL_QUIET=1 turns them off."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from tirl.core.logging import console


class ProgressHandle:
    def __init__(self, bar: Progress, task: int) -> None:
        self._bar, self._task = bar, task

    def advance(self, n: int = 1, info: str | None = None) -> None:
        self._bar.update(self._task, advance=n, **({"info": info} if info is not None else {}))


@contextmanager
def progress(description: str, total: int) -> Iterator[ProgressHandle]:
    """A bar with count, elapsed and remaining time; closes when the block ends."""
    bar = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        TextColumn("{task.fields[info]}"),
        console=console,
        disable=bool(os.environ.get("TIRL_QUIET")),
    )
    with bar:
        yield ProgressHandle(bar, bar.add_task(description, total=total, info=""))
