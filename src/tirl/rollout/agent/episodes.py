"""Episodes: problems rolled out through the agent loop and scored, the one path an RL step, an evaluation and
`tirl data sample` share.

Each problem is sampled `n` times, its samples adjacent (sample index 0..n-1); with `first_group`, the problems
are also numbered as RL advantage groups from there on. Each trajectory comes back carrying its problem and its
`Outcome`. Scoring itself (rewards/scoring.py) reads only text and problem rows: this module maps trajectories to
it. Before any sampling, `check_prompt_lengths` fails on a prompt that leaves no room for the response. Not here:
what the caller makes of the scores (advantages, eval records).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext

import torch

from tirl.data.lengths import MAX_CHARS_PER_TOKEN, text_chars
from tirl.data.records import ProblemRow
from tirl.rewards.scoring import Response, Score, score_responses
from tirl.rewards.shaping import RewardConfig
from tirl.rollout.agent.loop import AgentLoop
from tirl.rollout.sampling import SamplingParams
from tirl.rollout.types import Origin, Outcome, Trajectory
from tirl.sandbox.health import raise_if_sandbox_down


def responses_of(trajs: Sequence[Trajectory]) -> list[Response]:
    """What scoring reads of each trajectory: the assistant's own text, its problem and the shaping counts."""
    out = []
    for i, t in enumerate(trajs):
        if t.problem is None:
            raise ValueError(
                f"trajectory {i} has no problem to grade against: roll it out with an Origin (AgentLoop.run origins=)"
            )
        out.append(Response(t.answer_text, t.problem, t.num_executed_calls, t.response_length))
    return out


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
    seeds: Sequence[int] | None = None,
) -> tuple[list[Trajectory], list[Score]]:
    """`n` scored trajectories per problem, in problem order; a dead sandbox raises naming `where` (it is not a
    bad policy). `timed(phase)` wraps the "rollout" and the "reward"
    phase, `sampling_context()` the rollout inside it (the RL trainer times both phases and gathers a sharded
    policy for sampling). `seeds`: one request seed per trajectory instead of `generator`'s (the async loop only)."""
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
        given = {} if seeds is None else {"seeds": seeds}
        trajs = agent.run(
            [o.problem.prompt for o in origins], params, origins=origins, generator=generator, **given
        )
    raise_if_sandbox_down((c.exec_result for t in trajs for c in t.tool_calls if c.exec_result), where)
    with timed("reward"):
        scores = score_responses(
            responses_of(trajs), reward, max_len=agent.config.max_response_tokens, sandbox=agent.sandbox
        )
    for t, sc in zip(trajs, scores, strict=True):
        if t.reported_score is not None:  # an agent program's own reward (agent.program.reward=program)
            sc.reward, sc.parts = t.reported_score, {"reported": t.reported_score}
        t.outcome = Outcome(sc.correct, sc.reward, sc.pred, sc.verdict)
    return trajs, scores


def model_positions(agent: AgentLoop) -> int:
    """The positions the agent's in-process model holds (max_position_embeddings); 0 when the engine has no model
    of its own to ask (a server, which checks its own context length)."""
    return agent.engine.max_positions


def check_prompt_lengths(
    rows: Sequence[ProblemRow], agent: AgentLoop, max_positions: int, *, what: str = "eval"
) -> None:
    """Raise, naming the first of `what`'s rows and its length, if a rendered prompt plus the response budget
    exceeds `max_positions` (0: no limit known). A prompt past them would otherwise run for minutes on gigabytes.
    RL checks its rows with it too, after dropping those over agent.max_prompt_tokens."""
    if not max_positions:
        return
    # characters: a prompt with more cannot fit, and is refused before it is tokenized (tirl.data.lengths)
    most = max_positions * MAX_CHARS_PER_TOKEN
    for i, r in enumerate(rows):
        if text_chars(r.prompt, most) > most:
            raise ValueError(
                f"{what} row {i + 1} ({r.data_source} problem {r.problem_id}) has a prompt of more than {most} "
                f"characters (not tokenized: a token covers at most {MAX_CHARS_PER_TOKEN}), past the model's "
                f"{max_positions} positions (max_position_embeddings); shorten or drop the row"
            )
    budget = agent.config.max_response_tokens
    over = [
        (i, r, n)
        for i, r in enumerate(rows)
        if (n := len(agent.renderer.prompt_ids(r.prompt))) + budget > max_positions
    ]
    if over:
        i, row, n = over[0]
        more = f"; {len(over) - 1} more rows are too long" if len(over) > 1 else ""
        raise ValueError(
            f"{what} row {i + 1} ({row.data_source} problem {row.problem_id}) has a {n}-token prompt: with "
            f"agent.max_response_tokens={budget} it can reach {n + budget} tokens, past the model's "
            f"{max_positions} positions (max_position_embeddings); shorten or drop the row, or lower "
            f"agent.max_response_tokens{more}"
        )
