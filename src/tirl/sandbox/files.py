"""SandboxFusion's `files` and `fetch_files`, checked on the host before a run reaches a worker.

The worker (worker/runfiles.py) writes and reads only what passes here: paths inside the run's directory that can
be created there, in bounded number, so a bad request is refused with a clear error rather than fail in the worker.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Sequence

from tirl.sandbox.worker import wire as proto

MAX_FILE_ENTRIES = 1024  # `files` entries, and `fetch_files` paths, per request
MAX_PATH_BYTES = 1024  # one `files`/`fetch_files` path, UTF-8: with the run directory, far below PATH_MAX
MAX_NAME_BYTES = 255  # one path component (NAME_MAX)
MAX_PATH_DEPTH = 64  # components of one path


def _check_path(path: object, what: str) -> str:
    """`path` normalized, or ValueError naming it: text a file name can be, inside the run directory, and creatable
    there."""
    # a lone surrogate ("\ud800" in the JSON) is no file name, and the worker, which encodes each name, never sees one
    if isinstance(path, str):
        try:
            path.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(
                f"{what} path {path!r:.200} is not valid Unicode: {path[e.start]!r} at index {e.start} is a "
                "lone surrogate, which cannot be encoded (UTF-8) as a file name"
            ) from None
    rel = proto.safe_relpath(path)
    if rel is None:
        raise ValueError(f"{what} path {path!r:.200} must be relative and inside the run directory (no '..')")
    parts = rel.split("/")
    if len(rel.encode("utf-8", "surrogatepass")) > MAX_PATH_BYTES or len(parts) > MAX_PATH_DEPTH:
        raise ValueError(
            f"{what} path {path!r:.80}... is too long (at most {MAX_PATH_BYTES} bytes and {MAX_PATH_DEPTH} levels)"
        )
    for part in parts:
        if len(part.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
            raise ValueError(
                f"{what} path {path!r:.300}: a name {part[:40]!r}... is over {MAX_NAME_BYTES} bytes"
            )
    return rel


def file_request(files: dict[str, str | None], fetch_files: Sequence[str]) -> bytes:
    """The zygote's extra frame for SandboxFusion's `files`/`fetch_files`; ValueError names a bad path or content.

    Paths must stay inside the run's directory (relative, no `..`): SandboxFusion would write or read anywhere. They
    must also be creatable there (valid Unicode, name and path lengths, depth, no path that is both a file and
    another's folder, no two `files` names for one path, as `a//b` and `a/b`), and their number is bounded, so that
    a bad request is refused here rather than fail inside the worker.
    """
    if not files and not fetch_files:
        return b""
    for what, entries in (("files", files), ("fetch_files", fetch_files)):
        if len(entries) > MAX_FILE_ENTRIES:
            raise ValueError(f"{what} lists {len(entries)} paths; at most {MAX_FILE_ENTRIES} per request")
    written, named = {}, {}
    for path, content in files.items():
        rel = _check_path(path, "files")
        if rel in named:  # the worker would write both to one file, the last one winning
            raise ValueError(
                f"files: {named[rel]!r} and {path!r} are the same path {rel!r}; name each file once"
            )
        named[rel] = path
        if content is not None:
            written[rel] = path
            try:
                base64.b64decode(content, validate=True)
            except (ValueError, TypeError):
                raise ValueError(f"files[{path!r}] is not valid base64") from None
    for rel, path in written.items():
        parent = os.path.dirname(rel)
        while parent:
            if parent in written:
                raise ValueError(f"files: {written[parent]!r} is a file and also the folder of {path!r}")
            parent = os.path.dirname(parent)
    for path in fetch_files:
        _check_path(path, "fetch_files")
    return json.dumps({"files": files, "fetch": list(fetch_files)}).encode()
