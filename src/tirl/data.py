"""Dataset rows in the verl/Open-AgentRL schema, read from and written to JSONL.

RL/eval rows carry `prompt` (chat messages), `reward_model.ground_truth`, `data_source`, `ability` and
`extra_info`; SFT rows carry `messages` and `tools`. Parquet readers and full schema validation come with the data
issue; here a bad line is reported by file and line number.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tirl.io import atomic_write_jsonl


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    p = Path(path)
    if not str(path):
        raise ValueError("no data file given (set the stage's `data` key)")
    if not p.is_file():
        raise FileNotFoundError(f"data file {str(p)!r} does not exist")
    if p.suffix != ".jsonl":
        raise ValueError(f"{p}: only .jsonl data files are supported here, got {p.suffix!r}")
    rows = []
    with open(p, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{p}:{n}: not valid JSON ({e.msg})") from e
            if not isinstance(row, dict):
                raise ValueError(f"{p}:{n}: expected a JSON object, got {type(row).__name__}")
            rows.append(row)
    if not rows:
        raise ValueError(f"{p}: the file has no rows")
    return rows


def write_rows(path: str | Path, rows: Iterable[dict[str, Any]]) -> Path:
    return atomic_write_jsonl(path, rows)
