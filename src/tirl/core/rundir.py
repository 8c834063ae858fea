"""Output directories that a mistyped `--out` cannot destroy, and that two runs cannot share.

A directory a tirl command writes is marked as that command's: `.tirl-run.json` records the command (`sft`,
`rl`, `eval`, `demo`, `analyze`, `export`, `model import`) and when it first ran there. `--out DIR` is accepted
when DIR does not exist, is empty, or carries the marker of the same command (its own earlier run, which it
continues or replaces); anything else is refused before a byte is written, naming what is in the way. A demo or
eval directory written before markers existed is recognised by its files (and marked); an unmarked training run
is refused with the one-line command that marks it.

While a run uses its directory it holds `.tirl-lock`: an exclusive `fcntl.flock` on that file, whose content
names the holder (pid, host, command, start). The kernel drops the lock when the process ends however it ends,
so a lock file left by a killed run is stale by construction and is taken over with a note; a live holder makes
a second run fail at once, naming its pid. Under torchrun, rank 0 alone checks and locks (the other ranks write
where it does). The lock and the marker are tirl's own files, never opened through a link: a lock that is a
symbolic link or has a second name (a hard link) is refused naming it, since it is rewritten in place and would
empty the file it leads to; a marker that is a symbolic link is refused too (a marker is replaced by a rename,
never written in place). A run that claims its directory first removes what killed writers staged there
(`tirl.core.io.remove_stale_staging`).

A command that replaces its directory whole (`export`) records in the marker the files it wrote
(`recorded_files`), so that a later run can tell them from files a user or another command added there since.
`--out` is checked for what no command can write through (a dangling symbolic link, a path under a file) by
`tirl.core.io.check_output_path` before anything else.

Deliberately not here: locking single output files (`tirl data prepare`), and locks across hosts on file systems
without working `flock` (some NFS set-ups): there the lock still names the holder but cannot stop the second run.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tirl.core.errors import TirlError
from tirl.core.io import atomic_write_json, check_output_path, remove_stale_staging

MARKER = ".tirl-run.json"
LOCK = ".tirl-lock"
_OWN = (MARKER, LOCK)
# directories written before markers existed, recognised by a file only that command writes beside config.yaml
_UNMARKED = {"demo": "data/sft.jsonl", "eval": "records.jsonl"}


class RunDirError(TirlError):
    """An output directory that is another command's, holds foreign files, or is in use by another run."""


def _read_marker(path: str | Path) -> Any:
    """The marker of `path`, parsed, read without following a link (a linked marker reads as none)."""
    fd = os.open(Path(path) / MARKER, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as f:
        return json.loads(f.read(1 << 20))


def owner(path: str | Path) -> str | None:
    """The command whose run directory `path` is (its marker), or None."""
    try:
        return str(_read_marker(path)["command"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _refuse_links(path: Path) -> None:
    """Raise naming tirl's own file in `path` (marker, lock) that is a symbolic link."""
    for name in _OWN:
        if (path / name).is_symlink():
            raise RunDirError(_linked(path / name, f"is a symbolic link to {os.readlink(path / name)}"))


def _linked(file: Path, what: str) -> str:
    return (
        f"{file} {what}: tirl writes its {'lock' if file.name == LOCK else 'marker'} only into a file of its own; "
        "remove it (the file it leads to stays) or choose another --out"
    )


def check_out(path: str | Path, command: str) -> None:
    """Refuse `path` as `command`'s output unless it is absent, empty, or `command`'s own earlier run."""
    path = check_output_path(path)
    if path.exists() and not path.is_dir():
        raise RunDirError(f"--out {path} is a file, not a directory: choose a directory")
    if not path.is_dir():
        return
    _refuse_links(path)
    found = owner(path)
    if found == command or (found is None and _unmarked_run_of(path, command)):
        return
    entries = sorted(p.name for p in path.iterdir() if p.name not in _OWN)
    if not entries and found is None:
        return
    shown = ", ".join(entries[:5]) + (f" and {len(entries) - 5} more" if len(entries) > 5 else "")
    what = f"the output of tirl {found}" if found else f"not a tirl {command} directory (it holds {shown})"
    legacy = (
        f"; if it is a tirl {command} run written before run markers, mark it with "
        f'`echo \'{{"command": "{command}"}}\' > {path / MARKER}`'
        if found is None and (path / "config.yaml").is_file()
        else ""
    )
    raise RunDirError(
        f"--out {path} is {what}; tirl {command} writes only into a new or empty directory or its own earlier "
        f"run's (marked by {MARKER}): choose another --out{legacy}"
    )


def _unmarked_run_of(path: Path, command: str) -> bool:
    return command in _UNMARKED and (path / "config.yaml").is_file() and (path / _UNMARKED[command]).is_file()


def mark(path: str | Path, command: str, *, files: list[str] | None = None) -> None:
    """Record `path` as `command`'s directory (kept as first written when it is already marked), with the names of
    the `files` it wrote there when given (a directory that is replaced whole)."""
    if owner(path) != command or files is not None:
        record: dict[str, Any] = {"command": command, "created": _now()}
        if files is not None:
            record["files"] = sorted(files)
        atomic_write_json(Path(path) / MARKER, record)


def recorded_files(path: str | Path) -> set[str] | None:
    """The names the marker of `path` lists as written by its command, or None when it lists none."""
    try:
        files = _read_marker(path)["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return {str(f) for f in files} if isinstance(files, list) else None


def _main_rank() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


@contextlib.contextmanager
def claim(path: str | Path, command: str) -> Iterator[Path]:
    """Check, mark and lock `path` for one run of `command`; the lock is released when the block ends."""
    path = Path(path)
    if not _main_rank():
        yield path
        return
    check_out(path, command)
    path.mkdir(parents=True, exist_ok=True)
    fd = _lock(path, command)
    try:
        mark(path, command)
        if removed := remove_stale_staging(path):
            print(f"removed what a killed save left in {path}: {', '.join(removed)}")
        yield path
    finally:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)  # released cleanly: no holder to report
        os.close(fd)  # closing drops the flock


def _lock(path: Path, command: str) -> int:
    """An fd holding the exclusive lock of `path`, with this process recorded as its holder."""
    fd = _open_lock(path / LOCK)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(fd)
        os.close(fd)
        raise RunDirError(
            f"--out {path} is in use by tirl {holder.get('command', '?')} (pid {holder.get('pid', '?')} on "
            f"{holder.get('host', '?')}, since {holder.get('started', '?')}): wait for it to end, stop it, or "
            "choose another --out"
        ) from None
    stale = _holder(fd)
    if stale.get("pid"):
        print(
            f"note: {path / LOCK} was left by pid {stale['pid']} on {stale.get('host', '?')}, which no longer "
            "holds it (killed); taking it over"
        )
    me = {"pid": os.getpid(), "host": socket.gethostname(), "command": command, "started": _now()}
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(me) + "\n").encode(), 0)
    return fd


def _open_lock(lock: Path) -> int:
    """`lock` opened for reading and writing, created if absent, never through a link: it is rewritten in place."""
    try:  # O_NOFOLLOW: a symbolic link fails (ELOOP) instead of being opened; no O_TRUNC: the holder is read first
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o666)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise RunDirError(_linked(lock, f"is a symbolic link to {os.readlink(lock)}")) from None
        raise RunDirError(
            f"{lock} cannot be opened as tirl's lock ({e.strerror}): remove it or choose another --out"
        ) from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink > 1:
        os.close(fd)
        what = f"has {st.st_nlink} hard links" if stat.S_ISREG(st.st_mode) else "is not a regular file"
        raise RunDirError(_linked(lock, what))
    return fd


def _holder(fd: int) -> dict[str, Any]:
    try:
        data = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")
