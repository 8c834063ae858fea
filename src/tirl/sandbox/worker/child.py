"""The snippet's process, a fork of the zygote: what it sets up for itself before the snippet's first line, and
what the zygote resets before each fork so that no run shares it with the one before.

Standard library only: zygote.py loads this file inside the sandbox, where tirl is not importable.

Per run: its own directory under /tmp (its cwd, HOME and TMPDIR), the request's stdin from a memfd (or /dev/null),
stdout and stderr on the zygote's pipes, no other descriptor, rlimits (CPU, address space above the zygote's own,
file size, no core, process count), the OOM killer pointed at it rather than the zygote, and, when the zygote is
root, its own unprivileged uid (so it cannot signal the zygote or a runner, write root-owned files, or read 0700
ones), else no capability at all. The fork itself, its output and its end are the zygote's (zygote.py,
supervise.py); running the code as `python snippet.py` would is script.py's.
"""

from __future__ import annotations

import ctypes
import os
import random
import resource
import sys
import traceback

if __package__:  # imported on the host (tests, tools)
    from tirl.sandbox.worker import privileges, script, wire
else:  # loaded by path by zygote.py inside the sandbox (the same modules, never tirl's)
    import privileges
    import script
    import wire


def snippet_process(
    req: tuple,
    code: bytes | None,
    stdin: bytes | None,
    out_w: int,
    err_w: int,
    rundir: str,
    *,
    cfg: dict,
    base_vm: int,
    oom_protected: bool,
    libc: ctypes.CDLL,
) -> None:
    """The snippet's process; never returns. `code` None: the request's code and stdin are still on fd 0, ours to
    read. `base_vm`: the zygote's own address space, which the memory limit comes on top of."""
    status = 1
    try:
        code_len, stdin_len, _timeout, mem_mb, cpu_s, _extra_len = req
        if code is None:
            code = wire.read_exact(0, code_len)
            stdin = None if stdin_len == wire.NO_STDIN else wire.read_exact(0, stdin_len)
        if stdin is None:
            stdin_fd = os.open("/dev/null", os.O_RDONLY)
        else:
            stdin_fd = os.memfd_create("stdin")
            wire.write_all(stdin_fd, stdin)
            os.lseek(stdin_fd, 0, os.SEEK_SET)
        prepared = script.prepare(code)
        mem_mb = mem_mb or cfg["memory_mb"]
        os.dup2(stdin_fd, 0)
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        os.closerange(3, 65536)
        os.chdir(rundir)
        if not cfg["pidns"]:
            os.setsid()  # so the zygote can kill the run's process group
        _limit(cfg, base_vm + mem_mb * 2**20, cpu_s)
        if oom_protected:
            write_quietly("/proc/self/oom_score_adj", "500")  # and picks the snippet
        uid = cfg["uid"]  # -1: keep the zygote's
        if uid >= 0:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
        else:
            privileges.drop_capabilities(libc)
        status = script.snippet_main(*prepared)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:
                pass
    except BaseException:
        print_exc_quietly()
    finally:
        os._exit(status)


def _limit(cfg: dict, mem: int, cpu_s: int) -> None:
    """The run's rlimits: CPU seconds, address space `mem` bytes, file size, no core file, process count."""
    limits = [
        (resource.RLIMIT_CPU, (cpu_s, cpu_s + 1)),
        (resource.RLIMIT_AS, (mem, mem)),
        (resource.RLIMIT_FSIZE, (cfg["max_file_bytes"], cfg["max_file_bytes"])),
        (resource.RLIMIT_CORE, (0, 0)),
        (resource.RLIMIT_NPROC, (cfg["max_processes"], cfg["max_processes"])),
    ]
    for res, lim in limits:
        resource.setrlimit(res, lim)


def fresh_state(rundir: str) -> None:
    """Set in the zygote, before the fork, what each child must not share with the previous one (cheaper than
    after)."""
    os.environ["HOME"] = os.environ["TMPDIR"] = rundir
    random.seed()  # os.fork would reseed it in the child; the raw fork does not
    if "numpy" in sys.modules:  # numpy's global generator is never reseeded after a fork
        sys.modules["numpy"].random.seed(int.from_bytes(os.urandom(4), "little"))
    if "tempfile" in sys.modules:
        sys.modules["tempfile"].tempdir = None


def print_exc_quietly() -> None:
    """The traceback on stderr, if stderr still takes it (a forked child about to _exit)."""
    try:
        traceback.print_exc()
    except BaseException:
        pass


def write_quietly(path: str, text: str) -> bool:
    try:
        with open(path, "w") as f:
            f.write(text)
        return True
    except OSError:
        return False
