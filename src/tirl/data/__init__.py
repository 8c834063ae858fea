"""Datasets in the verl / Open-AgentRL schema: validated streaming readers, writers, what benchmark rows share.

`read_rows` / `write_rows` are what the stages and the demo use; `iter_rows` / `read_dataset` stream large files
and can skip-and-report bad rows instead of stopping at the first (see readers.py).
"""

from __future__ import annotations

import io
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tirl.core.io import atomic_write_bytes, atomic_write_jsonl, check_output_file, remove_stale_staging
from tirl.data.readers import SUFFIXES, ReadReport, iter_rows, read_dataset
from tirl.data.schema import RowError, SchemaError, validate_rl_row, validate_sft_row


def read_rows(path: str | Path, *, kind: str = "auto") -> list[dict[str, Any]]:
    """Every row of a .jsonl or .parquet file, validated; the first bad row raises a RowError."""
    return read_dataset(path, kind=kind)[0]


def _unwritable_suffix(p: Path) -> str | None:
    if p.suffix in SUFFIXES:
        return None
    return f"{p}: cannot write rows as {p.suffix or 'a file without a suffix'}; name it .jsonl or .parquet"


def claim_rows_out(path: str | Path, *, force: bool, option: str = "--out") -> Path:
    """Check `path` as a command's rows file to write, before any work (`check_output_file`, then its suffix), and
    remove what a killed earlier write of it staged (`tirl.core.io.remove_stale_staging`)."""
    p = check_output_file(path, force=force, option=option)
    if why := _unwritable_suffix(p):
        raise ValueError(f"{option} {why}")
    remove_stale_staging(p.parent, p.name)
    return p


def write_rows(path: str | Path, rows: Iterable[dict[str, Any]]) -> Path:
    """JSONL or parquet by the file's suffix, written atomically; any other suffix is refused, since the readers
    go by it too (JSONL in `g.csv` would be unreadable)."""
    p = Path(path)
    if why := _unwritable_suffix(p):
        raise ValueError(why)
    if p.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        buf = io.BytesIO()
        pq.write_table(pa.Table.from_pylist(list(rows)), buf)
        return atomic_write_bytes(p, buf.getvalue())
    return atomic_write_jsonl(p, rows)


__all__ = [
    "ReadReport",
    "claim_rows_out",
    "RowError",
    "SchemaError",
    "iter_rows",
    "read_dataset",
    "read_rows",
    "validate_rl_row",
    "validate_sft_row",
    "write_rows",
]
