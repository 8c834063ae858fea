"""The tasks tirl ships: `arith`, the demo's arithmetic problems solved with the code interpreter.

Registered like any user task (`tirl.tasks.register_task`); its rows are graded through the registry's routing
(data source "tirl/arith", ability "math": the math verifier).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tirl.tasks.arith import Problem, split_problems
from tirl.tasks.solver import scripted_trajectories
from tirl.tasks.task import DemoData, Task, register_task
from tirl.tasks.warmup import copy_warmup_rows

if TYPE_CHECKING:
    from tirl.run_config import TirlConfig
    from tirl.sandbox.types import Sandbox


def _splits(cfg: TirlConfig) -> tuple[list[Problem], list[Problem], list[Problem]]:
    t = cfg.task
    return split_problems(
        seed=cfg.seed,
        num_sft=t.num_sft,
        num_rl=t.num_rl,
        num_test=t.num_test,
        levels=tuple(t.levels),
        style=t.style,
    )


def arith_rows(split: str, cfg: TirlConfig) -> list[dict[str, Any]]:
    _, rl, test = _splits(cfg)
    return [p.to_row() for p in (rl if split == "train" else test)]


def arith_demo_data(cfg: TirlConfig, sandbox: Sandbox) -> DemoData:
    """Disjoint SFT / RL / test problems; SFT trajectories written by the scripted solver through the sandbox."""
    sft, rl, test = _splits(cfg)
    sft_rows = scripted_trajectories(sft, sandbox, cfg.task.solver, seed=cfg.seed)
    return DemoData(sft_rows, [p.to_row() for p in rl], [p.to_row() for p in test], copy_warmup_rows(sft))


register_task(Task("arith", rows=arith_rows, demo_data=arith_demo_data))
