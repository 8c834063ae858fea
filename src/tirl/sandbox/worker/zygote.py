"""The warm worker: runs INSIDE the isolation boundary, imports common modules once, forks once per snippet.

Started as a script (`python -I zygote.py CONFIG_JSON`) by tirl/sandbox/local.py; it and its two sibling modules
(wire.py: the protocol; script.py: running the snippet as `python snippet.py` would) import only the standard
library (plus the modules it preloads for snippets) and never tirl, so it starts fast and owns no host state.

Per run: a fresh directory under /tmp (its cwd, HOME and TMPDIR), pipes for stdout/stderr read here up to the
cap, a memfd for stdin, rlimits (CPU, address space, file size, no core, process count) set in the child, and,
when the zygote is root, the snippet switched to its own unprivileged uid (so it cannot signal the zygote, write
root-owned files, or read 0700 ones). When the snippet's main process exits, times out or floods its output,
every other process in the worker's pid namespace is SIGKILLed (kill(-1) spares only us and the namespace init),
so daemons and setsid() escapes die with the run. The directory (and, without a uid switch, all of /tmp) is
wiped before the next request. The child is a fresh fork of a zygote that never runs snippets: no Python state
carries over from one run to the next. A seccomp filter (BPF compiled by libseccomp on the host, see
seccomp.py) is loaded by the zygote once its modules are imported, so every snippet inherits it with the fork.
"""

from __future__ import annotations

import base64
import ctypes
import gc
import io
import json
import os
import random
import resource
import select
import shutil
import signal
import sys
import time
import traceback

# Started as a script inside the sandbox, tirl is not importable: the siblings are loaded by path, then their bare
# names are dropped again, so that a snippet's own `import wire` or `import script` is its own business.
if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import script
    import wire

    del sys.path[0], sys.modules["script"], sys.modules["wire"]
else:  # imported on the host (tests, tools): the same modules through the package
    from tirl.sandbox.worker import script, wire

_CHUNK = 65536
_DRAIN_S = 0.5


def _raw_fork() -> int:
    """fork(2) without os.fork's Python at-fork hooks, which cost ~0.6 ms of CPU per run with sympy loaded.

    Safe here because the zygote is single-threaded and holds the GIL across the call (PyDLL); the one hook
    snippets would notice, reseeding `random`, is done by the child itself.
    """
    pid = _libc_fork()
    if pid < 0:
        raise OSError(ctypes.get_errno(), "fork failed")
    return pid


try:
    _libc_fork = ctypes.PyDLL(None, use_errno=True).fork
    _libc_fork.restype = ctypes.c_int
    _libc_fork.argtypes = []
except (OSError, AttributeError):  # not glibc-like: the standard fork, hooks and all
    _raw_fork = os.fork  # noqa: F811


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


_PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 38, 22, 2


def _install_seccomp(prctl: object, prog: _SockFprog) -> None:
    """Load the prepared BPF program into this (child) process; an error ends the run rather than run unfiltered."""
    if prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    if prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP) failed")


def _write_quietly(path: str, text: str) -> bool:
    try:
        with open(path, "w") as f:
            f.write(text)
        return True
    except OSError:
        return False


class Zygote:
    def __init__(self, cfg: dict) -> None:
        self.cfg = cfg
        self.uid = cfg["uid"]  # -1: keep ours
        self.n = 0
        self.base_vm = 0
        self.oom_protected = False
        bpf = bytes.fromhex(cfg.get("seccomp_bpf", ""))
        self._bpf = ctypes.create_string_buffer(bpf, len(bpf))  # kept alive: the program points into it
        self.seccomp = _SockFprog(len(bpf) // 8, ctypes.addressof(self._bpf)) if bpf else None
        self._prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved once, not in every child

    def preload(self) -> None:
        for name in self.cfg["preload"]:
            try:
                __import__(name)
            except ImportError:
                pass
        if "numpy" in sys.modules:
            __import__("numpy.random")  # lazily imported otherwise: 15 ms in every child that reseeds it
        with open("/proc/self/statm") as f:
            self.base_vm = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        # The snippet's stdio, built once: unused (so empty) here, and after the child's dup2 they are its pipes.
        enc = {"encoding": "utf-8", "errors": "backslashreplace"}
        sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8", errors="replace")
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=True, **enc)
        sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), write_through=True, **enc)
        os.environ.pop("PWD", None)  # set by bwrap; meaningless for a snippet in its own directory
        self.oom_protected = _write_quietly("/proc/self/oom_score_adj", "-1000")  # the OOM killer spares us
        script.warm_child_path()
        gc.collect()
        gc.freeze()  # children then never touch (copy) the preloaded objects' pages to collect them
        if self.seccomp is not None:
            # Loaded here, once, and inherited by every fork: loading it per child (the kernel checks and JITs the
            # program) cost ~0.15 ms a run. The zygote itself needs none of the denied calls.
            _install_seccomp(self._prctl, self.seccomp)

    def child(
        self, prepared: tuple, stdin_fd: int, out_w: int, err_w: int, rundir: str, mem_mb: int, cpu_s: int
    ) -> None:
        status = 1
        try:
            os.dup2(stdin_fd, 0)
            os.dup2(out_w, 1)
            os.dup2(err_w, 2)
            os.closerange(3, 65536)
            os.chdir(rundir)
            if not self.cfg["pidns"]:
                os.setsid()  # so the zygote can kill the run's process group
            cfg = self.cfg
            mem = self.base_vm + mem_mb * 2**20
            limits = [
                (resource.RLIMIT_CPU, (cpu_s, cpu_s + 1)),
                (resource.RLIMIT_AS, (mem, mem)),
                (resource.RLIMIT_FSIZE, (cfg["max_file_bytes"], cfg["max_file_bytes"])),
                (resource.RLIMIT_CORE, (0, 0)),
                (resource.RLIMIT_NPROC, (cfg["max_processes"], cfg["max_processes"])),
            ]
            for res, lim in limits:
                resource.setrlimit(res, lim)
            if self.oom_protected:
                _write_quietly("/proc/self/oom_score_adj", "500")  # and picks the snippet
            if self.uid >= 0:
                os.setgroups([])
                os.setresgid(self.uid, self.uid, self.uid)
                os.setresuid(self.uid, self.uid, self.uid)
            status = script.snippet_main(*prepared)
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except BaseException:
                    pass
        except BaseException:
            try:
                traceback.print_exc()
            except BaseException:
                pass
        finally:
            os._exit(status)

    def run(
        self, code: bytes, stdin: bytes | None, timeout: float, mem_mb: int, cpu_s: int, extra: dict
    ) -> bytes:
        """One snippet, start to cleanup; returns the response frame."""
        self.n += 1
        rundir = f"/tmp/tirl-run-{os.getpid()}-{self.n}"  # pid: unique on a shared /tmp (isolation none)
        try:
            os.mkdir(rundir, 0o700)
        except FileExistsError:  # left by a killed worker that had our pid (isolation none)
            shutil.rmtree(rundir, ignore_errors=True)
            os.mkdir(rundir, 0o700)
        if self.uid >= 0:
            os.chown(rundir, self.uid, self.uid)
        if extra.get("files"):
            self._restore_files(rundir, extra["files"])
        if stdin is None:
            stdin_fd = os.open("/dev/null", os.O_RDONLY)
        else:
            stdin_fd = os.memfd_create("stdin")
            wire.write_all(stdin_fd, stdin)
            os.lseek(stdin_fd, 0, os.SEEK_SET)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        prepared = script.prepare(code)
        self._fresh_state(rundir)
        t0 = time.monotonic()
        pid = _raw_fork()
        if pid == 0:
            self.child(prepared, stdin_fd, out_w, err_w, rundir, mem_mb or self.cfg["memory_mb"], cpu_s)
        for fd in (stdin_fd, out_w, err_w):
            os.close(fd)
        pidfd = os.pidfd_open(pid)
        out, err, flags = self._collect(pid, pidfd, out_r, err_r, t0 + timeout)
        self._kill_all(0.0, pid)  # the loop may have ended on EOF with a background process still running
        _, wstatus = os.waitpid(pid, 0)
        wall = time.monotonic() - t0
        for fd in (out_r, err_r, pidfd):
            os.close(fd)
        self._reap()
        fetched = b""
        if extra.get("fetch"):  # every process of the run is dead: no symlink can change under us
            fetched = json.dumps({"files": self._fetch_files(rundir, extra["fetch"])}).encode()
        self._wipe(rundir)
        code_ = os.waitstatus_to_exitcode(wstatus)
        if code_ == -signal.SIGKILL and not flags & (wire.F_TIMEOUT | wire.F_TRUNCATED):
            flags |= wire.F_KILLED  # not by us: the host checks the memory cgroup's OOM counter
        return wire.RESP.pack(code_, flags, wall, len(out), len(err), len(fetched)) + out + err + fetched

    def _restore_files(self, rundir: str, files: dict) -> None:
        """SandboxFusion's `files`: base64 contents written under the run directory, subfolders created."""
        for path, content in files.items():
            rel = wire.safe_relpath(path)
            if rel is None or not isinstance(content, str):
                continue  # the host refuses unsafe paths with a clear error; None contents are skipped
            target = os.path.join(rundir, rel)
            parent = os.path.dirname(target)
            os.makedirs(parent, exist_ok=True)
            with open(target, "wb") as f:
                f.write(base64.b64decode(content))
            if self.uid >= 0:
                d = parent
                while d.startswith(rundir + "/"):
                    os.chown(d, self.uid, self.uid)
                    d = os.path.dirname(d)
                os.chown(target, self.uid, self.uid)

    def _fetch_files(self, rundir: str, paths: list) -> dict:
        """SandboxFusion's `fetch_files`: each regular file inside the run directory, base64; others are absent."""
        out = {}
        root = os.path.realpath(rundir) + "/"
        for path in paths:
            rel = wire.safe_relpath(path)
            if rel is None:
                continue
            real = os.path.realpath(os.path.join(rundir, rel))
            if not real.startswith(root) or not os.path.isfile(real):
                continue  # a symlink out of the run directory is not followed
            with open(real, "rb") as f:
                out[path] = base64.b64encode(f.read(self.cfg["max_file_bytes"])).decode()
        return out

    def _collect(
        self, pid: int, pidfd: int, out_r: int, err_r: int, deadline: float
    ) -> tuple[bytes, bytes, int]:
        """Read both pipes up to the cap until they close and the main process has exited (a snippet that
        closes its stdout still runs until it exits or times out); kill everything on timeout or overflow."""
        cap = self.cfg["max_output_bytes"]
        bufs = {out_r: bytearray(), err_r: bytearray()}
        flags = 0
        drain_until = 0.0  # set once everything is killed: the pipes must close within _DRAIN_S
        poller = select.poll()
        for fd in (out_r, err_r, pidfd):
            poller.register(fd, select.POLLIN)
        open_fds, exited = 2, False
        while open_fds or not exited:
            now = time.monotonic()
            if not drain_until and now >= deadline:
                flags |= wire.F_TIMEOUT
                drain_until = self._kill_all(now, pid)
            if drain_until and now >= drain_until:
                break  # a process we cannot see still holds a pipe: give up on it
            for fd, _ev in poller.poll(max(0.0, (drain_until or deadline) - now) * 1000):
                if fd == pidfd:
                    poller.unregister(pidfd)
                    exited = True
                    if not drain_until:
                        drain_until = self._kill_all(time.monotonic(), pid)  # main exited: no stragglers
                    continue
                chunk = os.read(fd, _CHUNK)
                if not chunk:
                    poller.unregister(fd)
                    open_fds -= 1
                    continue
                buf = bufs[fd]
                room = cap - len(buf)
                buf += chunk[:room]
                if len(chunk) > room and not flags & wire.F_TRUNCATED:
                    flags |= wire.F_TRUNCATED
                    if not drain_until:
                        drain_until = self._kill_all(time.monotonic(), pid)
        return bytes(bufs[out_r]), bytes(bufs[err_r]), flags

    def _fresh_state(self, rundir: str) -> None:
        """Set here, before the fork, what each child must not share with the previous one (cheaper than after)."""
        os.environ["HOME"] = os.environ["TMPDIR"] = rundir
        random.seed()  # os.fork would reseed it in the child; the raw fork does not
        if "numpy" in sys.modules:  # numpy's global generator is never reseeded after a fork
            sys.modules["numpy"].random.seed(int.from_bytes(os.urandom(4), "little"))
        if "tempfile" in sys.modules:
            sys.modules["tempfile"].tempdir = None

    def _kill_all(self, now: float, pid: int) -> float:
        try:
            if self.cfg["pidns"]:
                os.kill(-1, signal.SIGKILL)  # every process of our pid namespace but us (its init)
            else:
                os.killpg(pid, signal.SIGKILL)  # no namespace: only the run's session
        except (ProcessLookupError, PermissionError):
            pass
        return now + _DRAIN_S

    def _reap(self) -> None:
        """Wait for every process the run left (we are their init); re-kill any forked during the kill."""
        deadline = time.monotonic() + 2.0
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid:
                continue
            if not self.cfg["pidns"] or time.monotonic() > deadline:
                return  # without a namespace, the host-side group kill is all we can do
            self._kill_all(0.0, 0)
            time.sleep(0.001)

    def _wipe(self, rundir: str) -> None:
        try:
            os.rmdir(rundir)  # the common case: the snippet wrote no file
        except OSError:
            shutil.rmtree(rundir, ignore_errors=True)
        if self.cfg["private_tmp"]:
            # the snippet can write to /dev/shm (01777); to /tmp only as our uid (bwrap's tmpfs is root's, 0755)
            for d in ("/tmp", "/dev/shm") if self.uid < 0 else ("/dev/shm",):
                try:
                    entries = os.listdir(d)
                except OSError:
                    continue
                for e in entries:
                    if d == "/tmp" and e in self.cfg.get("keep_tmp", ()):
                        continue  # the interpreter or checkout bound back in (read-only); not the snippet's
                    p = os.path.join(d, e)
                    if os.path.isdir(p) and not os.path.islink(p):
                        shutil.rmtree(p, ignore_errors=True)
                    else:
                        try:
                            os.unlink(p)
                        except OSError:
                            pass

    def serve(self) -> None:
        max_runs = self.cfg["max_runs"]
        wire.write_all(1, b"R")
        while max_runs <= 0 or self.n < max_runs:
            try:
                head = wire.read_exact(0, wire.REQ.size)
            except EOFError:
                return
            code_len, stdin_len, timeout, mem_mb, cpu_s, extra_len = wire.REQ.unpack(head)
            code = wire.read_exact(0, code_len)
            stdin = None if stdin_len == wire.NO_STDIN else wire.read_exact(0, stdin_len)
            extra = json.loads(wire.read_exact(0, extra_len)) if extra_len else {}
            wire.write_all(1, self.run(code, stdin, timeout, mem_mb, cpu_s, extra))


def main() -> None:
    cfg = json.loads(sys.argv[1])
    if cfg["pidns"] and os.getpid() != 1:
        # kill(-1) outside a fresh pid namespace would hit every process we may signal: refuse
        sys.exit(f"zygote: expected pid 1 in a new pid namespace, got pid {os.getpid()}")
    z = Zygote(cfg)
    z.preload()
    z.serve()


if __name__ == "__main__":
    main()
