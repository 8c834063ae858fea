"""An agent program's episode as tirl served it, and the trajectories built from its tokens. Pure: no I/O.

Each completion is a `Call`: the prompt ids the endpoint sampled from, the sampled ids and their log-probs. A call
`continues` the episode when its prompt starts with the previous call's prompt plus its sampled ids, token for
token: the tokens in between (tool results, a user turn) enter the trajectory with loss mask 0, the sampled ones
with 1, exactly as tirl's own agent loop builds them. A call that does not continue is a divergence (the agent
edited or re-rendered its history): with `refuse` the episode trains nothing, with `split` each unbroken run of
calls becomes its own trajectory (in evaluation only the last, which holds the answer). An episode that timed
out, crashed or never called the model gives one trajectory with no response tokens and the reason as its error.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tirl.rollout.types import Origin, ToolCallRecord, Trajectory

# how an episode ended; only "ok" and "budget" give trainable tokens
STATUSES = ("ok", "budget", "timeout", "crashed", "no_calls", "no_score")


@dataclass
class Call:
    """One completion served to the program."""

    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    weight_version: int
    text: str  # the sampled ids decoded, special tokens kept
    continues: bool  # its prompt extends the previous call's prompt + sampled ids
    tool_calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # as returned to the program
    tool_results: list[str] = field(
        default_factory=list
    )  # tool messages sent after this call, by the next one

    @property
    def stream(self) -> list[int]:
        return self.prompt_ids + self.token_ids


@dataclass
class Episode:
    """What one run of the agent program did: its calls, its reported answer, how it ended."""

    id: str
    origin: Origin | None = None
    calls: list[Call] = field(default_factory=list)
    answer: str | None = None  # the final answer the program reported (else the last completion's text)
    score: float | None = None  # the reward the program reported (used with agent.program.reward=program)
    status: str = "ok"
    detail: str = ""  # why, when status is not "ok"

    @property
    def divergences(self) -> int:
        return sum(1 for c in self.calls[1:] if not c.continues)


def continues(previous: Call | None, prompt_ids: list[int]) -> bool:
    """`prompt_ids` extend the previous call's stream token for token (a first call continues nothing)."""
    if previous is None:
        return False
    stream = previous.stream
    return len(prompt_ids) >= len(stream) and prompt_ids[: len(stream)] == stream


def _chains(calls: list[Call]) -> list[list[Call]]:
    out: list[list[Call]] = []
    for c in calls:
        if c.continues and out:
            out[-1].append(c)
        else:
            out.append([c])
    return out


def _trajectory(chain: list[Call], origin: Origin | None) -> Trajectory:
    t = Trajectory.start(list(chain[0].prompt_ids), origin)
    for k, c in enumerate(chain):
        if k:
            inserted = c.prompt_ids[len(chain[k - 1].stream) :]
            t.response_ids += inserted
            t.loss_mask += [0] * len(inserted)
            t.logprobs += [0.0] * len(inserted)
            t.token_versions += [-1] * len(inserted)
        t.response_ids += c.token_ids
        t.loss_mask += [1] * len(c.token_ids)
        t.logprobs += list(c.logprobs)
        t.token_versions += [c.weight_version] * len(c.token_ids)
        t.turn_texts.append(c.text)
        t.weight_versions.append(c.weight_version)
        results = c.tool_results + [""] * (len(c.tool_calls) - len(c.tool_results))
        for (name, args), response in zip(c.tool_calls, results, strict=False):
            seen = k + 1 < len(chain)
            t.tool_calls.append(
                ToolCallRecord(len(t.turn_texts) - 1, None, response, "ok", None, name, args, seen)
            )
    t.check()
    return t


def _empty(prompt_ids: list[int], origin: Origin | None, error: str) -> Trajectory:
    t = Trajectory.start(list(prompt_ids), origin)
    t.stop_reason, t.error = "error", error
    return t


def trajectories(
    episode: Episode, prompt_ids: list[int], *, on_divergence: str, training: bool, reported: bool = False
) -> list[Trajectory]:
    """The trajectories of `episode` (`prompt_ids`: the problem's own prompt, for an episode without a usable
    call); every one carries the episode's answer as the text its verifier grades and, with `reported`
    (agent.program.reward=program), the program's score as its reward."""
    e = episode
    if reported and e.status in ("ok", "budget") and e.calls and e.score is None:
        e.status, e.detail = "no_score", "agent.program.reward=program but the program reported no score"
    if e.status not in ("ok", "budget") or not e.calls:
        why = e.detail or ("the program never called the model" if not e.calls else e.status)
        out = [_empty(e.calls[0].prompt_ids if e.calls else prompt_ids, e.origin, f"{e.status}: {why}")]
    elif e.divergences and on_divergence == "refuse":
        k = next(i for i, c in enumerate(e.calls) if i and not c.continues)
        error = f"refused: call {k} of the episode sent a history whose tokens differ from those sampled"
        out = [_empty(e.calls[0].prompt_ids, e.origin, error)]
    else:
        chains = _chains(e.calls)
        out = [_trajectory(c, e.origin) for c in (chains if training else chains[-1:])]
        for t in out:
            t.stop_reason = "answer" if e.status == "ok" else "budget"
    answer = e.answer if e.answer is not None else (e.calls[-1].text if e.calls else "")
    for t in out:
        t.graded_text = answer
        t.reported_score = e.score if reported else None
    return out
