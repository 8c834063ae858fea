"""Roll problems out and score them: the one path an RL step and an evaluation share.

Each problem is sampled `n` times, its samples adjacent (sample index 0..n-1); with `first_group`, the problems
are also numbered as RL advantage groups from there on. Each trajectory comes back carrying its problem and its
`Outcome`. Not here: what the caller makes of the scores (advantages, eval records).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext

import torch

from tirl.data.records import ProblemRow
from tirl.rewards.scoring import TrajectoryScore, score_trajectories
from tirl.rewards.shaping import RewardConfig
from tirl.rollout.agent import AgentLoop
from tirl.rollout.sampling import SamplingParams
from tirl.rollout.types import Origin, Outcome, Trajectory
from tirl.sandbox.health import raise_if_sandbox_down


def rollout_and_score(
    agent: AgentLoop,
    problems: Sequence[ProblemRow],
    params: SamplingParams,
    *,
    n: int,
    reward: RewardConfig,
    generator: torch.Generator | None,
    where: str,
    first_group: int | None = None,
    timed: Callable[[str], AbstractContextManager[object]] | None = None,
    sampling_context: Callable[[], AbstractContextManager[object]] | None = None,
) -> tuple[list[Trajectory], list[TrajectoryScore]]:
    """`n` scored trajectories per problem, in problem order; a dead sandbox raises naming `where` (it is not a
    bad policy). `timed(phase)` wraps the "rollout" and the "reward"
    phase, `sampling_context()` the rollout inside it (the RL trainer times both phases and gathers a sharded
    policy for sampling)."""
    timed = timed or (lambda _phase: nullcontext())
    sampling_context = sampling_context or nullcontext
    origins = [
        Origin(
            p,
            sample=k,
            group=None if first_group is None else first_group + g,
            temperature=params.temperature,
        )
        for g, p in enumerate(problems)
        for k in range(n)
    ]
    with timed("rollout"), sampling_context():
        trajs = agent.run([o.problem.prompt for o in origins], params, origins=origins, generator=generator)
    raise_if_sandbox_down((c.exec_result for t in trajs for c in t.tool_calls if c.exec_result), where)
    with timed("reward"):
        scores = score_trajectories(
            trajs, reward, max_len=agent.config.max_response_tokens, sandbox=agent.sandbox
        )
    for t, sc in zip(trajs, scores, strict=True):
        t.outcome = Outcome(sc.correct, sc.reward, sc.pred, sc.verdict)
    return trajs, scores
