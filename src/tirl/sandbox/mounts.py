"""What a bubblewrap sandbox sees of the host's files: the interpreter and what it loads, nothing else.

The root is an empty tmpfs with, read-only: /usr (programs, shared libraries, zoneinfo) and the /bin, /lib*
links or directories beside it; the few /etc files the dynamic linker and the C library read (ETC_FILES, not
/etc/passwd); the interpreter's own directories (prefix, base prefix, stdlib, site-packages, as the configured
interpreter reports them, both as called and with symlinks resolved); and the worker's code (tirl/sandbox/worker).
Everything else (/work, /home, /root, /var, /srv, /opt, /mnt, /run, /sys, the rest of /etc) is absent, so a
snippet cannot read ground truth, test cases or keys that sit on the same machine, whatever their permissions.
Only `isolation: bwrap` uses this; `unshare` and `none` see the host as tirl's uid does (see local.py).
"""

from __future__ import annotations

import functools
import json
import os
import subprocess

SYSTEM_DIRS = ("/usr",)
SYSTEM_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")  # merged-/usr links, or directories
# The dynamic linker's cache and config, time zone, name service (localhost inside the empty network), and the
# alternatives links some /usr/bin programs go through. Nothing with accounts, hosts' keys or secrets.
ETC_FILES = (
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/localtime",
    "/etc/timezone",
    "/etc/nsswitch.conf",
    "/etc/hosts",
    "/etc/alternatives",
)
_QUERY = (
    "import json, sys, sysconfig\n"
    "print(json.dumps([sys.prefix, sys.base_prefix, sys.exec_prefix, *sysconfig.get_paths().values()]))"
)


@functools.lru_cache(maxsize=8)
def _reported_dirs(python: str) -> tuple[str, ...]:
    """The directories `python` itself reports (run once per interpreter, ~30 ms): a venv's and its base's.

    OSError when it cannot say (the pool then refuses to start, quoting this message)."""
    try:
        out = subprocess.run([python, "-I", "-c", _QUERY], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise OSError(
            f"sandbox interpreter {python!r} could not be started to list its directories: {e}"
        ) from None
    if out.returncode != 0:
        raise OSError(f"sandbox interpreter {python!r} failed to list its directories: {out.stderr[-500:]}")
    return tuple(p for p in json.loads(out.stdout) if p)


def interpreter_dirs(python: str, worker_dir: str) -> list[str]:
    """Directories the sandboxed worker must read, as called and resolved; none inside another of the list."""
    exe = os.path.abspath(python)
    paths = {
        os.path.dirname(exe),
        os.path.dirname(os.path.realpath(exe)),
        worker_dir,
        *_reported_dirs(python),
    }
    paths |= {os.path.realpath(p) for p in paths}
    found = sorted(p for p in paths if os.path.isdir(p))
    return [d for d in found if not any(d.startswith(o.rstrip("/") + "/") for o in found if o != d)]


def system_mounts() -> list[str]:
    """bwrap args for /usr, the /bin and /lib links (kept as links where the host has links) and ETC_FILES."""
    cmd: list[str] = []
    for d in SYSTEM_DIRS:
        if os.path.isdir(d):
            cmd += ["--ro-bind", d, d]
    for p in SYSTEM_LINKS:
        if os.path.islink(p):
            cmd += ["--symlink", os.readlink(p), p]
        elif os.path.isdir(p):
            cmd += ["--ro-bind", p, p]
    cmd += ["--perms", "0755", "--dir", "/etc"]
    for f in ETC_FILES:
        if os.path.exists(f):
            cmd += ["--ro-bind", f, f]
    return cmd


def bind_dirs(dirs: list[str], *, covered: tuple[str, ...] = SYSTEM_DIRS) -> list[str]:
    """bwrap args binding each directory read-only at its own path, its parents created 0755 (bwrap would make
    them 0700, unreadable for the snippet's uid); directories already inside a `covered` mount are skipped."""
    cmd: list[str] = []
    made: set[str] = {"/", "/tmp", "/etc", *covered}
    for d in dirs:
        if any(d == c or d.startswith(c + "/") for c in covered):
            continue
        parts = d.strip("/").split("/")
        for i in range(1, len(parts)):
            anc = "/" + "/".join(parts[:i])
            if anc not in made:
                made.add(anc)
                cmd += ["--perms", "0755", "--dir", anc]
        cmd += ["--ro-bind", d, d]
    return cmd
