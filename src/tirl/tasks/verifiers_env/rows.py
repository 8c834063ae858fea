"""A verifiers environment's tasks as tirl problem rows, and the seed-fixed split that divides them.

verifiers gives a taskset no train/test split (a run picks tasks with `--select.*`), so tirl makes one: the
tasks in the order verifiers' own `Taskset.shuffle(seed)` gives under the split seed (`task.split_seed`, or the
run's `seed` when it is -1), the first `task.test_fraction` of them (at least one) held out as "test", the rest
"train"; `task.max_tasks` reads only the taskset's first tasks (an infinite taskset needs it).

A row's prompt is the task's own: its `system_prompt` as a system turn, then its `prompt` (a string is one user
turn; messages are kept, text only). Its ground truth is the task's data as JSON, everything the environment's
rewards read (`self.data`), from which the verifier rebuilds the task (`reward.py`); its id is the task's `id`,
else ENV-IDX (its position in the taskset).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tirl.core.bounds import MAX_ROWS, check_counts, check_range
from tirl.tasks.task import TaskOptions
from tirl.tasks.verifiers_env.load import LoadedEnv

MAX_SPLIT_SEED = 2**32 - 1  # as the run's seed


@dataclass
class VerifiersOptions(TaskOptions):
    """`task.*` of a `verifiers:ENV` task: how its tasks are read and split."""

    test_fraction: float = (
        0.2  # share of the tasks held out as the test split (at least one, and one left to train)
    )
    split_seed: int = -1  # the seed that fixes the split; -1 = the run's `seed`
    max_tasks: int = 0  # read only the taskset's first tasks (0 = all; an infinite taskset needs a number)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_range("task.test_fraction", self.test_fraction, 0.0, 1.0, low_open=True, high_open=True)
        check_counts(self, "task", {"split_seed": (-1, MAX_SPLIT_SEED), "max_tasks": (0, MAX_ROWS)})


def _text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    parts = list(content or [])
    if any(getattr(p, "type", "text") != "text" for p in parts):
        raise ValueError(f"{where}: only text content is supported (not images)")
    return "\n".join(p.text for p in parts)


def prompt_messages(data: Any, where: str) -> list[dict[str, str]]:
    """The task's system prompt and prompt as chat messages (text only)."""
    out = [{"role": "system", "content": data.system_prompt}] if data.system_prompt else []
    if data.prompt is None:
        raise ValueError(f"{where} has no prompt: tirl needs a user turn to start from")
    if isinstance(data.prompt, str):
        return [*out, {"role": "user", "content": data.prompt}]
    for m in data.prompt:
        if m.role not in ("system", "user", "assistant") or getattr(m, "tool_calls", None):
            raise ValueError(
                f"{where}: a prompt of system, user and assistant text turns is supported, not {m.role}"
            )
        out.append({"role": m.role, "content": _text(m.content, where)})
    return out


def task_row(env: LoadedEnv, task: Any) -> dict[str, Any]:
    """One task as a verl-schema row graded by the environment's verifier (`reward.py`)."""
    data = task.data
    pid = str(data.id) if data.id is not None else f"{env.env_id}-{data.idx}"
    return {
        "data_source": env.spec,
        "prompt": prompt_messages(data, f"task {env.spec!r}, task {pid}"),
        "ability": "verifiers",
        "reward_model": {"ground_truth": data.model_dump_json(exclude_defaults=True), "style": "verifiers"},
        "extra_info": {"id": pid, "idx": data.idx},
    }


def env_rows(env: LoadedEnv, split: str, options: VerifiersOptions, seed: int) -> list[dict[str, Any]]:
    """The rows of `split` ("train" or "test") under the seed-fixed split (module docstring)."""
    view = env.taskset.take(options.max_tasks) if options.max_tasks else env.taskset
    if not view.bounded:
        raise ValueError(
            f"task {env.spec!r}: the taskset is infinite; set task.max_tasks to read that many tasks"
        )
    tasks = list(view.shuffle(seed if options.split_seed < 0 else options.split_seed))
    if len(tasks) < 2:
        raise ValueError(f"task {env.spec!r}: {len(tasks)} task(s), too few to split into train and test")
    num_test = min(max(1, round(len(tasks) * options.test_fraction)), len(tasks) - 1)
    return [task_row(env, t) for t in (tasks[:num_test] if split == "test" else tasks[num_test:])]
