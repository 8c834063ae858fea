"""Tool-use statistics of a set of responses, overall and split by correct / incorrect: pure functions.

Used by the analysis (from evaluation records) and by the RL trainer (from rollouts), so the two report the same
numbers under the same names.
"""

from __future__ import annotations

from collections.abc import Sequence

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
