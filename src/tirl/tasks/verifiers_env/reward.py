"""A verifiers environment's rewards as the tirl verifier that grades its rows, and how their sum becomes a grade.

Grading one response: the task is rebuilt from the row's ground truth (its data as JSON, `rows.py`), a
`vf.Trace` made of the prompt and one sampled assistant message holding the text tirl grades (the assistant's
turns joined as the model wrote them; tool outputs are not in it and no tool message is replayed: a reward
reading `trace.last_reply`, `trace.messages` or `trace.assistant_messages` sees the answer, one counting turns
or reading `trace.tool_messages` does not see the episode), and
verifiers' own `Task.score(trace)` runs without a runtime on the environment's event loop (`loop.py`), within
the verifier's time limit (`reward.timeout_s`). Its rewards are async functions of the task and the trace
(`support.py` refuses the rest).

The mapping: verifiers' reward is the weighted sum of the scores (`trace.reward`), each score by convention in
[0, 1]. Full marks is every positive weight scored 1 and every negative one 0, no marks the reverse; the grade's
score is the reward placed on tirl's scale between them, -1 (no marks) to +1 (full marks), clipped there, so
partial credit keeps its place (half the marks of one reward scores 0.0) and the trainer sees the environment's
own ordering of answers. A response is correct only with full marks: a fractional score is incorrect for
accuracy and pass@k, while its reward still counts in training. A reward that raises, or scoring that times out,
grades -1 with `{"error": ...}` or `{"timeout": True}`, never as a plain wrong answer. The answer maj@k votes on
is tirl's default, the last \\boxed{}.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from tirl.rewards import GradeResult, last_boxed
from tirl.tasks.verifiers_env.load import LoadedEnv
from tirl.tasks.verifiers_env.loop import EnvLoop

DEFAULT_TIMEOUT_S = 30.0


def trace_of(env: LoadedEnv, task: Any, response: str) -> Any:
    """The trace a reward reads: the task's prompt, then `response` as the one sampled assistant message."""
    from verifiers.v1.state import state_cls

    vf, data = env.vf, task.data
    messages = [vf.SystemMessage(content=data.system_prompt)] if data.system_prompt else []
    prompt = data.prompt
    messages += [vf.UserMessage(content=prompt)] if isinstance(prompt, str) else list(prompt or [])
    messages.append(vf.AssistantMessage(content=response))
    nodes = [
        vf.MessageNode(message=m, parent=i - 1 if i else None, sampled=i == len(messages) - 1)
        for i, m in enumerate(messages)
    ]
    return vf.Trace(
        task=vf.TraceTask(type=type(task).__name__, data=data, key=task.key, hash=task.hash),
        state=state_cls(type(task))(),
        agent=vf.AgentInfo(config=vf.AgentConfig(), name="tirl", trainable=False),
        nodes=nodes,
    )


def to_grade(rewards: dict[str, Any], pred: str | None) -> GradeResult:
    """The grade of a scored trace's rewards ({name: vf.Reward}), as the module docstring maps it."""
    missing = [name for name, r in rewards.items() if r is None]
    if missing or not rewards:
        return GradeResult(
            -1.0, False, pred, {"error": f"rewards not scored: {', '.join(missing) or 'none'}"}
        )
    total = sum(r.value for r in rewards.values())
    best = sum(max(r.weight, 0.0) for r in rewards.values())
    worst = sum(min(r.weight, 0.0) for r in rewards.values())
    details = {"reward": total, "rewards": {name: r.score for name, r in rewards.items()}}
    if best == worst or not math.isfinite(total):
        return GradeResult(-1.0, False, pred, {**details, "error": "no finite reward with a nonzero weight"})
    score = min(1.0, max(-1.0, -1.0 + 2.0 * (total - worst) / (best - worst)))
    return GradeResult(score, total >= best - 1e-9, pred, details)


def env_grader(env: LoadedEnv, template: Any) -> Callable[..., GradeResult]:
    """The verifier function of `env`: `(response, ground_truth, *, timeout_s) -> GradeResult`. Each row's task is
    made as `template` (one of the taskset's tasks) was: its class, with its task config."""
    loop = EnvLoop(f"tirl-verifiers-reward-{env.env_id}")
    task_cls, data_cls = type(template), type(template).data_type()

    def grade(response: str, ground_truth: Any, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> GradeResult:
        pred = last_boxed(response)
        try:
            data = (
                data_cls.model_validate(ground_truth)
                if isinstance(ground_truth, dict)
                else data_cls.model_validate_json(str(ground_truth))
            )
            task = task_cls(data, template.config)
        except ValueError as e:
            return GradeResult(-1.0, False, pred, {"error": f"ground truth is not {env.spec} task data: {e}"})
        trace = trace_of(env, task, response)
        try:
            loop.run(task.score(trace, None), timeout_s)
        except TimeoutError:
            return GradeResult(-1.0, False, pred, {"timeout": True})
        except Exception as e:  # the environment's own failure is this row's error, not the run's
            return GradeResult(-1.0, False, pred, {"error": f"{type(e).__name__}: {e}"})
        return to_grade(trace.rewards, pred)

    return grade
