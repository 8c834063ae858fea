"""Per-problem correct counts: the smallest result from which pass@k, its intervals and every paired comparison
can be recomputed. `tirl eval` writes them as `counts.jsonl` beside its records (one line per data source,
temperature and problem: `n` samples, `correct` of them right; schema in docs/eval-records.md), and `tirl analyze`
reads such a file as a run.

The unbiased pass@k of a problem depends only on n and c, and so do Cover@tau, the accuracy histogram, the solvable
sets, the envelope and the paired bootstrap over problems: `count_groups` gives the analysis those counts per data
source and temperature. Not here: anything that needs the samples themselves (maj@k needs the answers, tool use
and the audit need the responses); the analysis skips those for a counts-only run.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tirl.core.bounds import MAX_COUNT
from tirl.core.io import atomic_write_jsonl

COUNTS_FILE = "counts.jsonl"
COUNTS_SUFFIX = ".counts.jsonl"
MAX_ROWS = 1 << 20  # problems x temperatures of one file (a 422-problem, 7-temperature study: ~3,000)
MAX_SAMPLES = 1 << 24  # sum of n over a file: the analysis holds an (P, n) grade and pass@k table per group
MAX_BYTES = 256 << 20  # ~150 bytes a row: MAX_ROWS rows fit well inside
_KEYS = ("data_source", "temperature", "problem_id", "n", "correct")


@dataclass(frozen=True)
class ProblemCount:
    """One problem at one temperature: n samples, `correct` of them right."""

    data_source: str
    temperature: float | None
    problem_id: str
    n: int
    correct: int


def temperature_key(t: float | None) -> str:
    """A temperature as the analysis keys it ("0.6"; "unknown" for imported runs that do not say)."""
    return "unknown" if t is None else f"{t:g}"


def is_counts_file(path: str | Path) -> bool:
    name = Path(path).name
    return name == COUNTS_FILE or name.endswith(COUNTS_SUFFIX)


def counts_from_records(records: Iterable[Any]) -> list[ProblemCount]:
    """Counts of graded records (anything with data_source, temperature, problem_id, correct), one per
    (data source, temperature, problem) in the order each first appears: the order they were evaluated in."""
    tally: dict[tuple[str, float | None, str], list[int]] = {}
    for r in records:
        nc = tally.setdefault((r.data_source, r.temperature, r.problem_id), [0, 0])
        nc[0] += 1
        nc[1] += bool(r.correct)
    return [ProblemCount(src, t, pid, n, c) for (src, t, pid), (n, c) in tally.items()]


def write_counts(path: str | Path, counts: Iterable[ProblemCount]) -> Path:
    return atomic_write_jsonl(path, (asdict(c) for c in counts))


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _row(row: Any, where: str) -> ProblemCount:
    if not isinstance(row, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(row).__name__}")
    missing = [k for k in _KEYS if k not in row]
    if missing:
        raise ValueError(f"{where}: counts row lacks {missing} (see docs/eval-records.md)")
    src, t, pid, n, c = (row[k] for k in _KEYS)
    for key, v in (("data_source", src), ("problem_id", pid)):
        if not isinstance(v, str):
            raise ValueError(f"{where}: {key!r} must be a string, got {v!r}")
        try:
            v.encode("utf-8")
        except UnicodeEncodeError as e:  # a lone surrogate would only fail when the report is written
            raise ValueError(f"{where}: {key!r} is not valid text ({e.reason})") from e
    if t is not None and (
        isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t) or t < 0
    ):
        raise ValueError(f"{where}: 'temperature' must be a number >= 0 or null, got {t!r}")
    if not _is_int(n) or not 1 <= n <= MAX_COUNT:
        raise ValueError(f"{where}: 'n' must be an integer in [1, {MAX_COUNT}], got {n!r}")
    if not _is_int(c) or not 0 <= c <= n:
        raise ValueError(f"{where}: 'correct' must be an integer in [0, n={n}], got {c!r}")
    return ProblemCount(src, None if t is None else float(t), pid, n, c)


def read_counts(path: str | Path) -> list[ProblemCount]:
    """A counts file's rows, checked: types and ranges per line, one row per (source, temperature, problem), one
    n per source and temperature, and a size the analysis can hold (errors name the file, and the line)."""
    path = Path(path)
    if path.stat().st_size > MAX_BYTES:
        raise ValueError(f"{path}: {path.stat().st_size} bytes, more than a counts file holds ({MAX_BYTES})")
    rows: list[ProblemCount] = []
    total = 0
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                parsed = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{i}: not valid JSON ({e.msg})") from e
            rows.append(_row(parsed, f"{path}:{i}"))
            total += rows[-1].n
            if len(rows) > MAX_ROWS or total > MAX_SAMPLES:
                raise ValueError(
                    f"{path}:{i}: more than {MAX_ROWS} rows or {MAX_SAMPLES} samples in all; split the file"
                )
    if not rows:
        raise ValueError(f"{path}: the file has no rows")
    count_groups(rows, str(path))
    return rows


def count_groups(
    counts: Sequence[ProblemCount], where: str = "counts"
) -> dict[tuple[str, str], tuple[list[str], int, np.ndarray]]:
    """(data source, temperature key) -> (problem ids sorted, n, correct counts (P,) in that order), sorted by
    key as the analysis orders its tables. A problem listed twice, or two n in one group, is an error."""
    groups: dict[tuple[str, str], dict[str, ProblemCount]] = {}
    for c in counts:
        key = (c.data_source, temperature_key(c.temperature))
        group = groups.setdefault(key, {})
        where_row = f"{where}: source {key[0]!r}, T={key[1]}, problem {c.problem_id!r}"
        if c.problem_id in group:
            raise ValueError(f"{where_row} is listed twice")
        first = next(iter(group.values()), c)
        if c.n != first.n:
            raise ValueError(
                f"{where_row} has n={c.n}, problem {first.problem_id!r} n={first.n}; pass@k needs one n per "
                "problem"
            )
        group[c.problem_id] = c
    out = {}
    for key, group in sorted(groups.items()):
        ids = sorted(group)
        n = group[ids[0]].n
        out[key] = (ids, n, np.array([group[pid].correct for pid in ids], dtype=np.int64))
    return out
