"""The files of one run inside the warm worker: the request's `files` written, `fetch_files` read back within the
byte budget, and whatever the run left in its directory and the worker's private tmpfs mounts wiped.

Standard library only: zygote.py loads this file inside the sandbox, where tirl is not importable. The zygote calls
these only in short-lived forks (a runner or a wiper), or, for is_clean, without listing a name: a file's name and
contents are the snippet's data and must not stay in the zygote's memory for a later fork to find.
"""

from __future__ import annotations

import base64
import os
import shutil

if __package__:  # imported on the host (tests, tools)
    from tirl.sandbox.worker import wire
else:  # loaded by path by zygote.py inside the sandbox, after wire (the same module, never tirl's)
    import wire


def restore(rundir: str, files: dict, uid: int) -> None:
    """SandboxFusion's `files`: base64 contents written under the run directory, subfolders created; owned by
    `uid` (the snippet's) when it is >= 0."""
    for path, content in files.items():
        rel = wire.safe_relpath(path)
        if rel is None or not isinstance(content, str):
            continue  # the host refuses unsafe paths with a clear error; None contents are skipped
        target = os.path.join(rundir, rel)
        parent = os.path.dirname(target)
        os.makedirs(parent, exist_ok=True)
        with open(target, "wb") as f:
            f.write(base64.b64decode(content))
        if uid >= 0:
            d = parent
            while d.startswith(rundir + "/"):
                os.chown(d, uid, uid)
                d = os.path.dirname(d)
            os.chown(target, uid, uid)


def fetch(rundir: str, paths: list, max_fetch_bytes: int, max_file_bytes: int) -> tuple[dict, dict]:
    """SandboxFusion's `fetch_files`: each regular file inside the run directory, base64, until the run's
    `max_fetch_bytes` (counting every listed path, so 20 spellings of one file cost 20 times its size) is
    spent; a file read once however it is spelled. Returns the files and {path: why} for those left out."""
    out, skipped, cache = {}, {}, {}
    budget = budget_all = max_fetch_bytes
    root = os.path.realpath(rundir) + "/"
    for path in paths:
        rel = wire.safe_relpath(path)
        if rel is None:
            continue
        real = os.path.realpath(os.path.join(rundir, rel))
        if not real.startswith(root) or not os.path.isfile(real):
            continue  # missing, not a regular file, or a symlink out of the run directory: absent, as there
        size = cache[real][0] if real in cache else min(os.path.getsize(real), max_file_bytes)
        if size > budget:
            skipped[path] = f"left out: the run's fetched files would exceed {budget_all} bytes"
            continue
        if real not in cache:
            with open(real, "rb") as f:
                cache[real] = (size, base64.b64encode(f.read(size)).decode())
        budget -= size
        out[path] = cache[real][1]
    return out, skipped


def wipe(rundir: str, cfg: dict) -> None:
    """Remove the run directory and, with a private /tmp, everything the run left in the worker's tmpfs mounts."""
    try:
        os.rmdir(rundir)  # the common case: the snippet wrote no file
    except OSError:
        shutil.rmtree(rundir, ignore_errors=True)
    if cfg["private_tmp"]:
        # the worker's own tmpfs mounts, which a snippet may write: /tmp and /dev/shm (01777), /var/tmp under
        # unshare as root
        for d in cfg["wipe_dirs"]:
            try:
                entries = os.listdir(d)
            except OSError:
                continue
            for e in entries:
                if d == "/tmp" and e in cfg.get("keep_tmp", ()):
                    continue  # the interpreter or checkout bound back in (read-only); not the snippet's
                p = os.path.join(d, e)
                if os.path.isdir(p) and not os.path.islink(p):
                    shutil.rmtree(p, ignore_errors=True)
                else:
                    try:
                        os.unlink(p)
                    except OSError:
                        pass


def is_clean(rundir: str, tmp_sizes: list[tuple[str, int]]) -> bool:
    """Whether the run left nothing to wipe, learnt without listing a name (a name is the snippet's data):
    its directory removes as empty, and each private tmpfs has its start-up size (tmpfs counts 20 bytes a
    directory entry)."""
    try:
        os.rmdir(rundir)
    except OSError:
        return False
    try:
        return all(os.stat(d).st_size == size for d, size in tmp_sizes)
    except OSError:
        return False
