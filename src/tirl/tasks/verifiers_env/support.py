"""What of a verifiers environment tirl can run, checked once when the task loads: anything else is refused with
an error naming the part and why, never run halfway.

tirl replaces verifiers' rollout machinery: its agent loop is the harness (the model's turns, tool calls and
their outputs), and the verifier grades the response text. So an environment qualifies when it is a plain
taskset (verifiers' `SingleAgentEnv`, the default harness) whose tasks score with `@vf.reward` functions of the
task and the trace alone. Refused: an `Env` subclass of its own (several agents, or a custom episode); a harness
the taskset ships; `Task.setup`, `finalize` or `stage_verifier` (they prepare a verifiers runtime, the agent's
box, which tirl never starts); rewards that take `runtime`; plugged judges (`TaskConfig.judges`) and task configs
holding a `JudgeConfig` (a judge asks a model, and tirl serves no model to rewards). A reward that reaches the
network on its own is not detected here: it fails when it grades, and the row reads as an error.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from tirl.tasks.verifiers_env.load import LoadedEnv

RUNTIME_HOOKS = ("setup", "finalize", "stage_verifier")


def needs_runtime(fn: Callable[..., Any]) -> bool:
    """A scoring hook that takes `runtime` without a default (as verifiers decides what it skips offline)."""
    param = inspect.signature(fn).parameters.get("runtime")
    return param is not None and param.default is inspect.Parameter.empty


def _judges(env: LoadedEnv, task: Any) -> list[str]:
    vf = env.vf
    plugged = [getattr(j, "id", "") or type(j).__name__ for j in task.config.judges]
    fields = [name for name, value in task.config if isinstance(value, vf.JudgeConfig)]
    out = []
    if plugged:
        out.append(f"it plugs judges ({', '.join(plugged)})")
    if fields:
        out.append(f"its task config holds a judge ({', '.join(fields)})")
    if type(task).plugged_judges is not vf.Task.plugged_judges:
        out.append("its Task overrides plugged_judges")
    return [f"{p}: a judge asks a model, and tirl serves none to rewards" for p in out]


def unsupported(env: LoadedEnv, task: Any) -> list[str]:
    """Each part of the environment tirl cannot run, as a clause saying why; [] when it can run all of it."""
    vf = env.vf
    out = []
    env_cls = vf.environment_class(env.env_id)
    if env_cls is not vf.SingleAgentEnv:
        out.append(
            f"it plays its tasks with its own Env ({env_cls.__name__}), where tirl runs one agent loop"
        )
    harness = vf.default_harness_id(env.env_id)
    if harness != "bash":  # verifiers' default: the taskset ships no harness
        out.append(f"it ships its own harness ({harness!r}), where tirl's agent loop is the harness")
    for hook in RUNTIME_HOOKS:
        if getattr(type(task), hook) is not getattr(vf.Task, hook):
            out.append(
                f"its Task.{hook} prepares a verifiers runtime (the agent's box), which tirl never starts"
            )
    out += _judges(env, task)
    rewards = task.hooks("reward")
    if not rewards:
        out.append("its Task has no @vf.reward to grade a response with")
    boxed = [fn.__name__ for fn in rewards if needs_runtime(fn)]
    if boxed:
        out.append(
            f"its rewards {', '.join(boxed)} take `runtime` (the agent's box), which tirl never starts"
        )
    return out


def check_supported(env: LoadedEnv, task: Any) -> None:
    """Raise a ValueError listing what tirl cannot run of the environment (see the module docstring)."""
    problems = unsupported(env, task)
    if problems:
        raise ValueError(
            f"task {env.spec!r} cannot run in tirl: "
            + "; ".join(problems)
            + ". tirl runs a plain taskset whose "
            "@vf.reward functions read only the task and the trace (the prompt and the response)"
        )
