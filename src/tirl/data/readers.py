"""Stream rows from parquet (pyarrow, batch by batch) and JSONL (line by line), validating every one.

A bad row becomes a `RowError` naming file, row number (1-based, counting data rows) and column: a JSONL line
that is not UTF-8 or not JSON, nested deeper than Python's recursion limit reads, or holding a lone surrogate (a
`\\ud800`-`\\udfff` escape without its pair, which no tokenizer encodes) included. With
`on_error="raise"` the first one stops the read; with "skip" it is collected in `ReadReport.errors` and counted,
so nothing is dropped silently. File-level problems (missing, empty, truncated parquet) always raise.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tirl.data.schema import VALIDATORS, RowError, SchemaError, detect_kind

SUFFIXES = (".jsonl", ".parquet")
_BATCH_ROWS = 1024
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")  # how a surrogate reaches a JSON line
_LONE_SURROGATE = re.compile(
    "[\ud800-\udfff]"
)  # json.loads joins a pair into one character: one left is lone
LONE_SURROGATE = "holds a lone surrogate (a \\ud800-\\udfff escape without its pair), not text"
TOO_DEEP = "nested too deeply to read (arrays or objects inside one another past Python's recursion limit)"


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
            except RecursionError:
                yield n, RowError(str(p), n, None, TOO_DEEP)
                continue
            if not isinstance(rec, dict):
                yield n, RowError(str(p), n, None, f"expected a JSON object, got {type(rec).__name__}")
                continue
            if _SURROGATE_ESCAPE.search(line) and (column := _lone_surrogate(rec)) is not None:
                yield n, RowError(str(p), n, column, LONE_SURROGATE)
                continue
            yield n, rec


def _lone_surrogate(rec: dict[str, Any]) -> str | None:
    """The column (dotted, `messages[1].content`) of the first string in `rec` holding a lone surrogate, else None;
    a walk with its own stack, as the row may be nested as deeply as json.loads reads."""
    stack: list[tuple[str, Any]] = [("", rec)]
    while stack:
        where, value = stack.pop()
        if isinstance(value, str):
            if _LONE_SURROGATE.search(value):
                return where
        elif isinstance(value, dict):
            for k, v in reversed(list(value.items())):
                if _LONE_SURROGATE.search(k):
                    return f"{where}.{k!a}" if where else ascii(k)
                stack.append((f"{where}.{k}" if where else k, v))
        elif isinstance(value, list):
            stack.extend((f"{where}[{i}]", v) for i, v in reversed(list(enumerate(value))))
    return None


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
            except RecursionError:  # a column holding a JSON string nested too deeply for the validator
                rec = RowError(str(path), n, None, TOO_DEEP)
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
