"""The wire protocol between the host (local.py) and the warm worker (zygote.py), and the path rule both apply.

Standard library only: zygote.py loads this file inside the sandbox, where tirl is not importable.

Protocol on the worker's fds 0 (requests) and 1 (responses), binary and compact so a run costs a fork, not framing:
  ready:    READY once the preloads are imported, and again after each response once the run's files are wiped;
            the host sends a request only after it (a worker whose cleanup outlasts the host's patience is replaced)
  request:  REQ header (code length, stdin length or NO_STDIN, timeout s, memory MB or 0, CPU s, extra length)
            + code + stdin + extra (JSON {"files": {path: base64}, "fetch": [path]}, empty when neither is used);
            the zygote reads the header, the run's child (or runner, with extra) the rest
  response: RESP header (exit code, flags, wall s, stdout length, stderr length, extra length)
            + stdout + stderr + extra (JSON {"files": {path: base64}, "skipped": {path: why}} of the fetched
            files and those left out for the fetch limit, empty when none asked)
"""

from __future__ import annotations

import os
import struct

REQ = struct.Struct("!IIdIII")
RESP = struct.Struct("!iBdIII")
NO_STDIN = 0xFFFFFFFF
READY = b"R"
F_TIMEOUT, F_TRUNCATED, F_KILLED = 1, 2, 4  # F_KILLED: SIGKILL from outside the run (e.g. the OOM killer)


def read_exact(fd: int, n: int) -> bytes:
    parts, left = [], n
    while left:
        b = os.read(fd, min(left, 1 << 20))
        if not b:
            raise EOFError
        parts.append(b)
        left -= len(b)
    return b"".join(parts)


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def safe_relpath(path: str) -> str | None:
    """`path` normalized if it names something inside the run directory (relative, no `..`), else None."""
    if not isinstance(path, str) or not path or "\0" in path or os.path.isabs(path):
        return None
    try:
        path.encode()
    except UnicodeEncodeError:  # a lone surrogate: no file can have that name (the host refuses it clearly)
        return None
    norm = os.path.normpath(path)
    if norm in (".", "..") or norm.startswith("../"):
        return None
    return norm
