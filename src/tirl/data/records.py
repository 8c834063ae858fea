"""The typed record of one problem as it flows from data to rollout to rewards, built in one place for RL and eval.

A verl-schema row (`data_source`, `prompt`, `ability`, `reward_model.ground_truth`, `extra_info`) is validated
once and becomes a `ProblemRow`, which each trajectory of it carries (`Trajectory.problem`) to the verifier and
into eval records. A row without a `data_source` is "unknown" (graded as math). The problem id is `extra_info.id`,
else `extra_info.index`, else the row's position in its file, so RL logs and eval records name a problem the same
way.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tirl.data.readers import read_dataset
from tirl.data.schema import SchemaError, validate_rl_row


@dataclass(frozen=True)
class ProblemRow:
    """One problem: `prompt` (chat messages ending with the user turn), what grades it (`ground_truth`, routed by
    `data_source` / `ability` to a verifier) and the row's other fields (`extra`, the row's extra_info)."""

    problem_id: str
    data_source: str
    prompt: list[dict[str, Any]]
    ground_truth: Any
    ability: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_row(cls, row: dict[str, Any], index: int) -> ProblemRow:
        """From a verl-schema row (validated; SchemaError names the column); `index` is its position."""
        row = {"data_source": "unknown", **row}  # in-memory rows may leave the source out
        return cls.from_valid(validate_rl_row(row), index)

    @classmethod
    def from_valid(cls, r: dict[str, Any], index: int) -> ProblemRow:
        """From a row `validate_rl_row` already returned (as `read_rows(kind="rl")` does): not validated again."""
        info = r["extra_info"]
        pid = info.get("id", info.get("index", index))
        return cls(
            str(pid), r["data_source"], r["prompt"], r["reward_model"]["ground_truth"], r["ability"], info
        )


def read_problems(path: str | Path) -> list[ProblemRow]:
    """The problems of an RL/eval file, each row validated once (a bad row raises a RowError naming file, row and
    column)."""
    rows, _ = read_dataset(path, kind="rl")
    return [ProblemRow.from_valid(r, i) for i, r in enumerate(rows)]


def problem_rows(rows: Iterable[dict[str, Any] | ProblemRow]) -> list[ProblemRow]:
    """Rows as records (records pass through); a bad row raises naming its position and column."""
    out = []
    for i, r in enumerate(rows):
        if isinstance(r, ProblemRow):
            out.append(r)
            continue
        try:
            out.append(ProblemRow.from_row(r, i))
        except SchemaError as e:
            raise ValueError(f"row {i + 1}, column {e.column!r}: {e.message}") from None
    return out
