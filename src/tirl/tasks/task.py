"""A task bundles what a run needs beyond the model: its data, its tools, its verifier and its prompt wording.

`tirl rl|eval|demo task=NAME` picks a registered task (`register_task`), `task=my_pkg.tasks:sql_task` imports
one from the user's own package (installed, or under the working directory) (a `Task`, or a function declared
`-> Task` that takes no arguments; nothing else named there is called), and `task=PREFIX:NAME` asks a registered
task source (`register_task_source`: `verifiers:ENV`, a verifiers environment) to build one, so adding a task
never means editing tirl. The verifier is routed through the one registry (`tirl.rewards.registry`): a task
that names one sends its `data_sources` to it once, when it is registered (a plugin's task or factory, when it is first loaded); two tasks
that send one source to different verifiers are an error, so which verifier grades a row never depends on which
task a run loaded. Rows come from the stage's data file when one is set (`rl.data`,
`eval.data`), else from the task's `rows(split, options, seed)` ("train" for RL, "test" for eval): a task is built from its own
`task.*` options and the run's seed, never from the whole run config.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from tirl.rewards.registry import route
from tirl.tools.base import Tool, ToolSet
from tirl.tools.code_interpreter import default_tools

if TYPE_CHECKING:
    from tirl.sandbox.types import Sandbox

SPLITS = ("train", "test")


@dataclass
class TaskOptions:
    """`task.*` of the config: the task's name and, in a subclass a task declares (`Task.options`), its own
    settings. The config loader builds the subclass `task.name` names, so `task.*` holds only what that task reads."""

    VARIANT_KEY: ClassVar[str] = "name"

    name: str = "arith"  # a registered task, or package.module:attribute

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("task.name must name a task (e.g. arith, or my_pkg.tasks:my_task)")

    @classmethod
    def config_variant(cls, value: Any) -> type[TaskOptions]:
        """The options dataclass of the task named `value` (the loader's hook, tirl.core.config)."""
        return load_task(str(value)).options


def default_task_options() -> TaskOptions:
    """The default task's options at their defaults."""
    return TaskOptions.config_variant(TaskOptions.name)()


@dataclass(frozen=True)
class TrainingData:
    """What a run from scratch trains and evaluates on (`tirl demo` runs one): SFT conversations, RL and held-out
    prompts, warm-up rows."""

    sft_rows: list[dict[str, Any]]
    rl_rows: list[dict[str, Any]]
    test_rows: list[dict[str, Any]]
    warmup_rows: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class Task:
    """One task. `tools` are listed in the system turn and dispatched by name; `verifier` (a registered name) grades
    rows of `data_sources`; `system_prompt` is used when `chat.system_prompt` is empty; `rows(split, options, seed)`
    gives verl-schema rows; `training_data(options, seed, sandbox, max_tool_response_chars)` what `tirl demo` needs
    (SFT trajectories included, their tool outputs cut as the agent cuts them); `options` the dataclass of its
    `task.*` settings, which both callbacks get (`cfg.task`) with the run's `seed`; `prepare(wording, split)` a
    whole split as `tirl data prepare NAME` writes it, for a task that ships its data; `user_file` what file a task
    whose data tirl does not ship reads instead (`--source FILE`, for `--help`), its `prepare(wording, split,
    source)` then given the path, or None when `--source` is missing (its own error says what to pass)."""

    name: str
    tools: Sequence[Tool] = field(default_factory=default_tools)
    verifier: str | None = None
    data_sources: Sequence[str] = ()
    system_prompt: str | None = None
    rows: Callable[[str, TaskOptions, int], list[dict[str, Any]]] | None = None
    training_data: Callable[[TaskOptions, int, Sandbox, int], TrainingData] | None = None
    options: type[TaskOptions] = TaskOptions  # the task's `task.*` settings: a TaskOptions subclass
    # `tirl data prepare NAME`: every problem of a split ("test", "train") as rows, in a wording ("recipe", "plain")
    prepare: Callable[..., list[dict[str, Any]]] | None = None
    # e.g. "GPQA's CSV": `prepare` reads the user's file (`--source`); "" = tirl ships the task's data
    user_file: str = ""

    def __post_init__(self) -> None:
        ToolSet(self.tools)  # two tools with one name, or a non-tool, fail here
        if not (isinstance(self.options, type) and issubclass(self.options, TaskOptions)):
            raise ValueError(
                f"task {self.name!r}: options must be a TaskOptions subclass, got {self.options!r}"
            )
        if self.user_file and self.prepare is None:
            raise ValueError(
                f"task {self.name!r} reads the user's {self.user_file} but has no prepare to read it"
            )
        if self.verifier is not None and not self.data_sources:
            raise ValueError(
                f"task {self.name!r} names verifier {self.verifier!r} but no data_sources to route to it"
            )

    def toolset(self) -> ToolSet:
        return ToolSet(self.tools)

    def route_sources(self) -> Task:
        """Send the task's data sources to its verifier: once, when the task is registered (a plugin's, when it is
        first loaded). Idempotent; a source another task already sends elsewhere is an error. Returns the task."""
        for source in self.data_sources if self.verifier else ():
            route(source, self.verifier, by=f"task {self.name!r}")
        return self

    def load_rows(self, split: str, options: TaskOptions, seed: int) -> list[dict[str, Any]]:
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; valid: {', '.join(SPLITS)}")
        if self.rows is None:
            key = "rl.data" if split == "train" else "eval.data"
            raise ValueError(f"task {self.name!r} has no rows of its own: set {key}=FILE")
        return self.rows(split, options, seed)


_TASKS: dict[str, Task | Callable[[], Task] | str] = {}
_TASK_SOURCES: dict[str, tuple[str, str]] = {}  # spec prefix -> (its factory's module:function, usage)


def register_task_source(prefix: str, factory: str, usage: str) -> None:
    """Make `task=PREFIX:REST` a task another library defines (`verifiers:ENV`): the function `factory` names
    (`package.module:function`, imported on first use, as a plugin is) builds the Task from REST; `usage` is how
    the error for an unknown task names the form (`verifiers:ENV`)."""
    _TASK_SOURCES[prefix] = (factory, usage)


def register_task(task: Task | Callable[[], Task] | str, name: str | None = None) -> None:
    """Make a task available as `task=NAME`: a Task, a factory called when the task is first loaded, or a plugin's
    `package.module:attribute`, imported then (so a plugin above this layer is named, never imported, here)."""
    key = name or getattr(task, "name", None)
    if not key:
        raise ValueError("register_task needs a name for a task factory or a module:attribute")
    if isinstance(task, Task):
        task.route_sources()
    _TASKS[key] = task


def task_names() -> list[str]:
    return sorted(_TASKS)


def prepared_tasks() -> dict[str, Task]:
    """The registered tasks that ship their data (`Task.prepare`), by name: what `tirl data prepare` offers."""
    return {k: t for k, t in sorted(_TASKS.items()) if isinstance(t, Task) and t.prepare is not None}


def _is_task_factory(obj: Any) -> bool:
    """A plain function declared to return a Task that takes no arguments: the only thing a `module:attribute` spec
    calls, so that `task=os:system` names no task instead of running a command."""
    if not inspect.isfunction(obj):
        return False
    sig = inspect.signature(obj)
    required = (
        inspect.Parameter.POSITIONAL_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        inspect.Parameter.KEYWORD_ONLY,
    )
    if any(p.default is p.empty and p.kind in required for p in sig.parameters.values()):
        return False
    ret = sig.return_annotation
    if isinstance(ret, str):  # postponed annotations: the name, as written
        return ret.strip("'\"").rsplit(".", 1)[-1].endswith("Task")
    return isinstance(ret, type) and issubclass(ret, Task)


def load_task(spec: str) -> Task:
    """A registered task by name, or `package.module:attribute` (a Task, or a function declared `-> Task` that takes
    no arguments; anything else there is refused, never called)."""
    if ":" in spec:
        module, _, attr = spec.partition(":")
        if (
            os.getcwd() not in sys.path
        ):  # as `python -m` and uvicorn do: the user's package in the working directory
            sys.path.append(os.getcwd())
        if module in _TASK_SOURCES:
            factory, _ = _TASK_SOURCES[module]
            where, _, name = factory.partition(":")
            return getattr(importlib.import_module(where), name)(attr).route_sources()
        try:
            obj = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as e:
            raise ValueError(f"task {spec!r}: cannot import {attr!r} from {module!r} ({e})") from None
        if not isinstance(obj, Task) and not _is_task_factory(obj):
            raise ValueError(
                f"task {spec!r} is a {type(obj).__name__}, not a tirl.tasks.Task (nor a function declared "
                "`-> Task` that takes no arguments): package.module:attribute must name a task"
            )
    elif spec in _TASKS:
        obj = _TASKS[spec]
        if isinstance(obj, str):
            return load_task(obj)
    else:
        raise ValueError(
            f"unknown task {spec!r}; valid: {', '.join([*task_names(), *(u for _, u in _TASK_SOURCES.values())])}"
            " or package.module:attribute"
        )
    if isinstance(obj, Task):
        return obj if spec in _TASKS else obj.route_sources()  # a registered Task was routed when registered
    task = obj()
    if not isinstance(task, Task):
        raise ValueError(f"task {spec!r} is a {type(task).__name__}, not a tirl.tasks.Task")
    return task.route_sources()
