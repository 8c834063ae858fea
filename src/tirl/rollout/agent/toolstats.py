"""Tool-use statistics of a set of responses, overall and split by correct / incorrect: pure functions.

The one place these numbers are computed: the RL trainer's logs (`rollout/<name>`, from each step's rollouts),
`tirl eval`'s summaries and `tirl analyze` (from evaluation records) use them, under the same names.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

BUDGET_STOPS = ("budget", "max_turns", "turn_length")  # stop reasons that mean "a limit cut the response"


def _block(
    calls: Sequence[int],
    errors: Sequence[int],
    turns: Sequence[int],
    lengths: Sequence[int | None],
    stops: Sequence[str],
) -> dict[str, float]:
    n = len(calls)
    if n == 0:
        return {"responses": 0.0}
    known = [x for x in lengths if x is not None]
    known_stops = [
        s for s in stops if s != "unknown"
    ]  # a verl dump records no stop reason: not "no budget hit"
    out = {
        "responses": float(n),
        "tool_calls_per_response": sum(calls) / n,
        "tool_error_rate": sum(errors) / max(1, sum(calls)),
        "no_tool_share": sum(c == 0 for c in calls) / n,
        "turns": sum(turns) / n,
    }
    if known_stops:
        out["budget_share"] = sum(s in BUDGET_STOPS for s in known_stops) / len(known_stops)
    if known:
        out["response_tokens"] = sum(known) / len(known)
    return out


class ToolUse(Protocol):
    """What the statistics read from one response (an eval record, or the RL trainer's per-rollout numbers)."""

    @property
    def num_tool_calls(self) -> int: ...
    @property
    def num_tool_errors(self) -> int: ...
    @property
    def turns(self) -> int: ...
    @property
    def response_tokens(self) -> int | None: ...
    @property
    def stop_reason(self) -> str: ...


def tool_stats(responses: Sequence[ToolUse], correct: Sequence[bool]) -> dict[str, float]:
    """`tool_use_stats` of these responses."""
    rs = responses
    return tool_use_stats(
        [r.num_tool_calls for r in rs],
        [r.num_tool_errors for r in rs],
        [r.turns for r in rs],
        [r.response_tokens for r in rs],
        [r.stop_reason for r in rs],
        correct,
    )


def tool_use_stats(
    calls: Sequence[int],
    errors: Sequence[int],
    turns: Sequence[int],
    lengths: Sequence[int | None],
    stops: Sequence[str],
    correct: Sequence[bool],
) -> dict[str, float]:
    """Flat metrics: `<name>` over all responses, `correct/<name>` and `incorrect/<name>` over each part.

    Names: responses, tool_calls_per_response, tool_error_rate (errors per call), no_tool_share, turns,
    budget_share (stopped by a token, turn or per-turn budget; among responses whose stop reason is known),
    response_tokens (where known).
    """
    cols = (calls, errors, turns, lengths, stops)
    if any(len(c) != len(correct) for c in cols):
        raise ValueError("tool_use_stats: all columns must have the same length")
    out = _block(*cols)
    for name, want in (("correct", True), ("incorrect", False)):
        idx = [i for i, ok in enumerate(correct) if bool(ok) == want]
        part = _block(*([col[i] for i in idx] for col in cols))
        out.update({f"{name}/{k}": v for k, v in part.items()})
    return out
