"""Atomic file output: a crash or a full disk never leaves a half-written result or checkpoint behind.

Every file tirl writes goes to a temporary sibling first and is renamed into place, so a reader sees either the
old content or the new, never a mix. Directories (checkpoints) are staged the same way, and a staging directory
is removed on any failure, the final rename's included. The temporary files are created private (0600/0700,
Python's `tempfile`); what is renamed into place gets the modes the umask gives any file or directory (0644/0755
under the usual 022), so outputs can be shared as the user's other files are. That holds for every file inside a
staged directory too, whoever wrote it: safetensors writes its files 0600 whatever the umask.

A writer killed outright (SIGKILL, a lost node) leaves its temporary sibling behind. Its name says whose it is:
`.NAME.tirl-HOST-PID.XXXXXXXX.tmp` (HOST: a short hash of the host name; XXXXXXXX: tempfile's random part), and so
does the previous copy `atomic_dir` sets aside while it renames (`.NAME.tirl-HOST-PID.old`). `remove_stale_staging`,
which the next command writing NAME (or claiming the directory) runs, removes exactly what writers of this host
that are no longer alive left, and never a live writer's staging or a user's file.

`check_output_path` is the one check of a command's `--out` before anything is written: a dangling symbolic link,
or a path under a file, is refused with a message naming it instead of an OSError halfway through; an output file
(`check_output_file`) that is a symbolic link is refused too, since the rename would replace the link, not the file
it leads to. `staged_contents` builds a command's outputs (`tirl analyze`) in a staging directory inside its output
directory and moves them into place only once all are written. The files tirl appends to (metrics, samples, a
server's log) are opened by `open_append`, never through a symbolic link or a second name.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
import socket
import stat
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from tirl.core.errors import TirlError

_HOST = hashlib.sha256(socket.gethostname().encode()).hexdigest()[:6]
# staging (tempfile's random part: 8 of [a-z0-9_]) and a set-aside copy; a pid has at most 7 digits (pid_max <= 2**22)
_STAGED = re.compile(
    r"^\.(?P<name>.+)\.tirl-(?P<host>[0-9a-f]{6})-(?P<pid>\d{1,7})\.(?P<kind>[a-z0-9_]{8}\.tmp|old)$"
)


class OutputPathError(TirlError):
    """An output path that cannot be written: a dangling symbolic link, or a path under a file."""


def check_output_path(path: str | Path, option: str = "--out") -> Path:
    """Refuse `path` as an output if it, or a directory it needs, is a dangling symbolic link or a file."""
    path = Path(path)
    if path.is_symlink() and not path.exists():
        raise OutputPathError(
            f"{option} {path} is a symbolic link to {os.readlink(path)}, which does not exist (or loops): "
            f"remove the link or choose another {option}"
        )
    for parent in path.parents:  # nearest first; stop at the first existing directory
        if parent.is_dir():
            break
        if parent.is_symlink() and not parent.exists():
            raise OutputPathError(
                f"{option} {path}: {parent} is a symbolic link to {os.readlink(parent)}, which does not exist "
                f"(or loops): remove the link or choose another {option}"
            )
        if parent.exists():
            raise OutputPathError(
                f"{option} {path}: {parent} is a file, not a directory: choose another {option}"
            )
    return path


def check_output_file(path: str | Path, *, force: bool, option: str = "--out") -> Path:
    """Refuse `path` as a file to write if it is a directory, or exists and `force` is not given (a command's
    output file is never replaced by accident)."""
    path = check_output_path(path, option)
    if path.is_symlink():
        raise OutputPathError(
            f"{option} {path} is a symbolic link to {os.readlink(path)}: tirl writes a new file and renames it into "
            f"place, which would replace the link, not the file it leads to; name that file as {option}, or remove "
            "the link"
        )
    if path.is_dir():
        raise OutputPathError(f"{option} {path} is a directory: name the file to write (.parquet or .jsonl)")
    if path.exists() and not force:
        raise OutputPathError(
            f"{option} {path} already exists: pass --force to replace it, or choose another {option}"
        )
    return path


def open_append(path: str | Path, *, binary: bool = False) -> IO[Any]:
    """`path` opened to append to (created if absent), refusing a symbolic link, a second name (a hard link) and
    anything but a regular file: an append lands in whatever file the name leads to, not one tirl made."""
    path = Path(path)
    # NOFOLLOW: a symbolic link fails (ELOOP); NONBLOCK: a FIFO without a reader fails (ENXIO) instead of waiting
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
    try:
        fd = os.open(path, flags, 0o666)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise OutputPathError(_appended(path, f"is a symbolic link to {os.readlink(path)}")) from None
        if e.errno == errno.ENXIO:
            raise OutputPathError(_appended(path, "is not a regular file")) from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink > 1:
        os.close(fd)
        what = f"has {st.st_nlink} hard links" if stat.S_ISREG(st.st_mode) else "is not a regular file"
        raise OutputPathError(_appended(path, what))
    os.set_blocking(fd, True)
    return os.fdopen(fd, "ab") if binary else os.fdopen(fd, "a", encoding="utf-8")


def _appended(path: Path, what: str) -> str:
    return (
        f"{path} {what}: tirl appends only to a file of its own; remove it (the file it leads to stays) or "
        "choose another output directory"
    )


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _umask() -> int:
    """The process's umask, read without changing it (Linux: /proc); else set and restored at once."""
    with contextlib.suppress(OSError, ValueError, StopIteration):
        with open("/proc/self/status") as f:
            return int(next(line for line in f if line.startswith("Umask:")).split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _stage_prefix(path: Path) -> str:
    """The start of a staging name for `path`, naming this process (the pid is read now: a fork has its own)."""
    return f".{path.name}.tirl-{_HOST}-{os.getpid()}."


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):  # another user's live process; or not a pid at all: left alone
        return True
    return True


def remove_stale_staging(directory: str | Path, name: str | None = None) -> list[str]:
    """Remove from `directory` what writers killed midway left (of the output `name` only, when given) and return
    the names: the staging files and directories this module names, of writers on this host no longer alive. A
    copy that `atomic_dir` set aside is put back when its replacement never arrived (the only copy), else removed."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    removed = []
    for p in sorted(directory.iterdir()):
        m = _STAGED.match(p.name)
        if not m or (name is not None and m["name"] != name) or m["host"] != _HOST or _alive(int(m["pid"])):
            continue
        target = directory / m["name"]
        if m["kind"] == "old" and p.is_dir() and not (target.exists() or target.is_symlink()):
            os.replace(p, target)  # killed between atomic_dir's two renames
            continue
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
        removed.append(p.name)
    return removed


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Write `data` to `path` through a temporary file in the same directory, then rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=_stage_prefix(path), suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)
    return path


def atomic_write_text(path: str | Path, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | Path, obj: Any, *, indent: int | None = 2) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=indent, ensure_ascii=False) + "\n")


def atomic_write_jsonl(path: str | Path, rows: Iterable[Any]) -> Path:
    return atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def read_jsonl(path: str | Path) -> list[Any]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


@contextlib.contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """Yield a staging directory; on success it replaces `path` whole, on error it is removed.

    The previous content of `path` (an older checkpoint) survives until the new one is complete.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=_stage_prefix(path), suffix=".tmp", dir=path.parent))
    old = None
    try:
        yield stage
        _follow_umask(stage)
        if path.exists():
            old = path.with_name(_stage_prefix(path) + "old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(path, old)
        os.replace(stage, path)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        if old is not None and not path.exists():  # the new one did not arrive: the old one goes back
            with contextlib.suppress(OSError):
                os.replace(old, path)
        raise
    _fsync_dir(path.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def staged_contents(path: str | Path) -> Iterator[Path]:
    """Yield a staging directory inside the directory `path`; on success each entry written there replaces the entry
    of its name in `path` (a directory whole), on error the staging is removed and `path` keeps what it held. The
    moves are renames within one file system: they need no space, so a full disk fails before any, while writing."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=_stage_prefix(path), suffix=".tmp", dir=path))
    try:
        yield stage
        _follow_umask(stage)
        for entry in sorted(stage.iterdir()):
            _replace_entry(entry, path / entry.name)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    _fsync_dir(path)


def _replace_entry(new: Path, target: Path) -> None:
    """Rename `new` onto `target`; a directory in the way is set aside first and removed once `new` is in place."""
    if not (target.is_dir() and not target.is_symlink()):
        os.replace(new, target)
        return
    old = target.with_name(_stage_prefix(target) + "old")
    shutil.rmtree(old, ignore_errors=True)
    os.replace(target, old)
    try:
        os.replace(new, target)
    except BaseException:
        os.replace(old, target)
        raise
    shutil.rmtree(old, ignore_errors=True)


def _follow_umask(stage: Path) -> None:
    """Give `stage` and everything in it the modes the umask gives (executables stay executable)."""
    mask = _umask()
    os.chmod(stage, 0o777 & ~mask)
    for root, dirs, files in os.walk(stage):
        for name in dirs + files:
            p = os.path.join(root, name)
            if os.path.islink(p):  # a link has no mode of its own; its target is not ours to change
                continue
            executable = name in dirs or os.stat(p).st_mode & 0o111
            os.chmod(p, (0o777 if executable else 0o666) & ~mask)
