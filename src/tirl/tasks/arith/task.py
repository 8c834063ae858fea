"""`arith`, the default task: generated arithmetic problems solved with the code interpreter.

Its rows are graded through the registry's routing (data source "tirl/arith", ability "math": the math verifier).
Its `task.*` options are `ArithOptions`: the splits, the levels and question style, and the scripted solver that
writes its SFT trajectories. The tiny demo's own settings (the model's shape, the copy warm-up) are `demo.*`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from tirl.core.bounds import MAX_ROWS, check_counts
from tirl.tasks.arith.problems import STYLES, Problem, split_problems
from tirl.tasks.arith.solver import SolverConfig, scripted_trajectories
from tirl.tasks.arith.warmup import copy_warmup_rows
from tirl.tasks.task import Task, TaskOptions, TrainingData, register_task

if TYPE_CHECKING:
    from tirl.sandbox.types import Sandbox


@dataclass
class ArithOptions(TaskOptions):
    """`task.*` of the arithmetic task (see tirl.tasks.arith.problems)."""

    MOVED_KEYS: ClassVar[dict[str, str]] = {"tiny": "demo.tiny", "warmup": "demo.warmup"}  # the tiny demo's

    num_sft: int = 3000
    num_rl: int = 2000
    num_test: int = 200
    levels: list[int] = field(default_factory=lambda: [1, 2, 3])  # difficulty levels drawn
    style: str = "plain"  # plain | word | mixed questions
    solver: SolverConfig = field(default_factory=SolverConfig)

    def __post_init__(self) -> None:
        super().__post_init__()
        if min(self.num_sft, self.num_rl, self.num_test) < 1:
            raise ValueError("task.num_sft, num_rl and num_test must be >= 1")
        check_counts(
            self, "task", {"num_sft": (1, MAX_ROWS), "num_rl": (1, MAX_ROWS), "num_test": (1, MAX_ROWS)}
        )
        if self.style not in STYLES:
            raise ValueError(f"unknown style {self.style!r}; valid: {list(STYLES)}")


def _splits(t: ArithOptions, seed: int) -> tuple[list[Problem], list[Problem], list[Problem]]:
    return split_problems(
        seed=seed,
        num_sft=t.num_sft,
        num_rl=t.num_rl,
        num_test=t.num_test,
        levels=tuple(t.levels),
        style=t.style,
    )


def arith_rows(split: str, options: ArithOptions, seed: int) -> list[dict[str, Any]]:
    _, rl, test = _splits(options, seed)
    return [p.to_row() for p in (rl if split == "train" else test)]


def arith_training_data(
    options: ArithOptions, seed: int, sandbox: Sandbox, max_tool_response_chars: int
) -> TrainingData:
    """Disjoint SFT / RL / test problems; SFT trajectories written by the scripted solver through the sandbox (its
    tool outputs cut at `task.solver.max_tool_response_chars`, not the agent's cap)."""
    sft, rl, test = _splits(options, seed)
    sft_rows = scripted_trajectories(sft, sandbox, options.solver, seed=seed)
    return TrainingData(sft_rows, [p.to_row() for p in rl], [p.to_row() for p in test], copy_warmup_rows(sft))


ARITH = Task("arith", rows=arith_rows, training_data=arith_training_data, options=ArithOptions)
register_task(ARITH)
