"""Stream rows from parquet (pyarrow, batch by batch) and JSONL (line by line), validating every one.

A bad row becomes a `RowError` naming file, row number (1-based, counting data rows) and column. With
`on_error="raise"` the first one stops the read; with "skip" it is collected in `ReadReport.errors` and counted,
so nothing is dropped silently. File-level problems (missing, empty, truncated parquet) always raise.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tirl.data.schema import VALIDATORS, RowError, SchemaError, detect_kind

SUFFIXES = (".jsonl", ".parquet")
_BATCH_ROWS = 1024


@dataclass
class ReadReport:
    """What a read saw: rows kept, rows skipped (each with its error), and the detected kind (rl or sft)."""

    file: str
    kind: str = ""
    rows: int = 0
    errors: list[RowError] = field(default_factory=list)

    @property
    def skipped(self) -> int:
        return len(self.errors)

    def summary(self) -> str:
        return f"{self.file}: {self.rows} {self.kind or ''} rows read, {self.skipped} skipped"


def _check_path(path: str | Path) -> Path:
    if not str(path):
        raise ValueError("no data file given (set the stage's `data` key)")
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"data file {str(p)!r} does not exist")
    if p.suffix not in SUFFIXES:
        raise ValueError(
            f"{p}: unsupported data file type {p.suffix!r}; expected one of {', '.join(SUFFIXES)}"
        )
    return p


def _jsonl_records(p: Path) -> Iterator[tuple[int, dict[str, Any] | RowError]]:
    n = 0
    with open(p, "rb") as f:
        for raw in f:
            if not raw.strip():
                continue
            n += 1
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                yield n, RowError(str(p), n, None, f"not valid UTF-8 (byte {e.start} of the line)")
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                yield n, RowError(str(p), n, None, f"not valid JSON ({e.msg} at char {e.pos})")
                continue
            if not isinstance(rec, dict):
                yield n, RowError(str(p), n, None, f"expected a JSON object, got {type(rec).__name__}")
                continue
            yield n, rec


def _parquet_records(p: Path) -> Iterator[tuple[int, dict[str, Any] | RowError]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(p)
    except (pa.ArrowException, OSError) as e:
        raise ValueError(f"{p}: not a readable parquet file (truncated or corrupt?): {e}") from None
    n = 0
    try:
        for batch in pf.iter_batches(batch_size=_BATCH_ROWS):
            for rec in batch.to_pylist():
                n += 1
                yield n, rec
    except (pa.ArrowException, OSError) as e:
        raise ValueError(f"{p}: parquet data unreadable after row {n}: {e}") from None


def iter_records(path: str | Path) -> Iterator[tuple[int, dict[str, Any] | RowError]]:
    """(row number, raw dict or RowError) pairs, unvalidated; raises if the file itself is unusable."""
    p = _check_path(path)
    return _parquet_records(p) if p.suffix == ".parquet" else _jsonl_records(p)


def iter_rows(
    path: str | Path, *, kind: str = "auto", on_error: str = "raise", report: ReadReport | None = None
) -> Iterator[dict[str, Any]]:
    """Validated, normalized rows of an RL/eval or SFT file (kind auto-detected from the first good row)."""
    if kind not in ("auto", *VALIDATORS):
        raise ValueError(f"kind must be auto or one of {', '.join(VALIDATORS)}, got {kind!r}")
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error must be raise or skip, got {on_error!r}")
    report = report if report is not None else ReadReport(str(path))
    seen = 0
    for n, rec in iter_records(path):
        seen += 1
        if isinstance(rec, dict):
            try:
                if kind == "auto":
                    kind = detect_kind(rec)
                    report.kind = kind
                yield VALIDATORS[kind](rec)
                report.rows += 1
                continue
            except SchemaError as e:
                rec = RowError(str(path), n, e.column, e.message)
        if on_error == "raise":
            raise rec
        report.errors.append(rec)
    report.kind = report.kind or (kind if kind != "auto" else "")
    if seen == 0:
        raise ValueError(f"{path}: the file has no rows")


def read_dataset(
    path: str | Path, *, kind: str = "auto", on_error: str = "raise"
) -> tuple[list[dict[str, Any]], ReadReport]:
    report = ReadReport(str(path))
    rows = list(iter_rows(path, kind=kind, on_error=on_error, report=report))
    return rows, report
