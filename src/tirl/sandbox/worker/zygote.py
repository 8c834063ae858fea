"""The warm worker: runs INSIDE the isolation boundary, imports common modules once, forks once per snippet.

Started as a script (`python -I zygote.py CONFIG_JSON`) by tirl/sandbox/local.py; it and its sibling modules
(wire.py: the protocol; child.py: the snippet's process set up; script.py: running the snippet as
`python snippet.py` would; supervise.py: its output read and its processes killed and reaped; runfiles.py: the
run's files written, fetched and wiped; privileges.py: what keeps a snippet from the worker itself) import only the
standard library (plus the modules it preloads for snippets) and never tirl, so it starts fast and owns no host
state.

No request's data stays where a later snippet could find it: every snippet is a fork of the zygote, and whatever
the zygote once held in its heap (freed or not) the next tenant could read back from its own memory. So the zygote
reads only a request's fixed header (lengths and limits), into a buffer it zeroes; the forked child reads its own
code and stdin from fd 0 before it runs anything; the output is read into preallocated buffers, written out from
them and zeroed; a request with `files` or `fetch_files` is read and run by a short-lived *runner* (a fork that
exits with it), and the run's leftover files are listed and removed by another (a file name is data too), forked
only when the run left any (its directory does not remove as empty, or a private tmpfs is not at its start-up
size). The reply is written before that cleanup and the ready byte after it; the host sends the next request
only after the ready byte, so a cleanup however long (a snippet's million files) never delays the run's own
reply, and the host replaces a worker whose cleanup does not end in time.

Per run: a fresh directory under /tmp, pipes for stdout/stderr read up to the cap, the child's limits and identity
(child.py); when the snippet's main process exits, times out or floods its output, every other process in the
worker's pid namespace is SIGKILLed (supervise.py). The directory and the worker's private /tmp, /dev/shm (and
/var/tmp under unshare as root) are wiped before the next request. The child is a fresh fork of a zygote that
never runs snippets: no Python state carries over from one run to the next. A seccomp filter (BPF compiled by
libseccomp on the host, see seccomp.py) is loaded by the zygote once its modules are imported, so every runner and
snippet inherits it.
"""

from __future__ import annotations

import ctypes
import gc
import io
import json
import mmap
import os
import select
import shutil
import signal
import sys
import time

# Started as a script inside the sandbox, tirl is not importable: the siblings are loaded by path, then their bare
# names are dropped again, so that a snippet's own `import wire` or `import script` is its own business.
if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import child
    import privileges
    import runfiles
    import script
    import supervise
    import wire

    del sys.path[0]
    del sys.modules["child"], sys.modules["privileges"], sys.modules["runfiles"]
    del sys.modules["script"], sys.modules["supervise"], sys.modules["wire"]
else:  # imported on the host (tests, tools): the same modules through the package
    from tirl.sandbox.worker import child, privileges, runfiles, script, supervise, wire

_RUNNER_EOF = 3  # the runner's exit status when fd 0 closed before a request: the zygote ends
_PR_SET_CHILD_SUBREAPER = 36


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
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._prctl = self._libc.prctl  # resolved once, not in every child
        # stdout, stderr (each up to one byte past the cap), a scratch buffer to drain a flood, a request header:
        # anonymous maps, zero until used and zeroed after each run (a later fork must find nothing in them)
        sizes = (cfg["max_output_bytes"] + 1, cfg["max_output_bytes"] + 1, supervise.CHUNK, wire.REQ.size)
        self._bufs = [(ctypes.c_char * n).from_buffer(mmap.mmap(-1, n)) for n in sizes]
        self._views = [memoryview(b).cast("B") for b in self._bufs]
        # each private tmpfs and its size with nothing of a run in it
        self._tmp_sizes: list[tuple[str, int]] = []
        # each private tmpfs's access and modification times at start, put back after every run
        self._tmp_times: list[tuple[str, tuple[int, int]]] = []
        self._last_pid_fd = -1  # /proc/sys/kernel/ns_last_pid, where we may write it

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
        if self.cfg["private_tmp"]:
            self._tmp_sizes = [(d, os.stat(d).st_size) for d in self.cfg["wipe_dirs"] if os.path.isdir(d)]
            self._tmp_times = [(d, _times(d)) for d, _ in self._tmp_sizes]
        self.oom_protected = child.write_quietly(
            "/proc/self/oom_score_adj", "-1000"
        )  # the OOM killer spares us
        if self.cfg["pidns"]:
            self._last_pid_fd = privileges.hide_from_snippets(self._libc)
        privileges.not_dumpable(self._libc)
        script.warm_child_path()
        gc.collect()
        gc.freeze()  # children then never touch (copy) the preloaded objects' pages to collect them
        if self.seccomp is not None:
            # Loaded here, once, and inherited by every fork: loading it per child (the kernel checks and JITs the
            # program) cost ~0.15 ms a run. The zygote itself needs none of the denied calls.
            _install_seccomp(self._prctl, self.seccomp)

    def _reset_pids(self) -> None:
        """The next fork gets pid 2 (every process of the last run is reaped): pids count nothing of earlier runs."""
        privileges.reset_pids(self._last_pid_fd)

    def run(self, rundir: str, req: tuple, code: bytes | None, stdin: bytes | None, extra: dict) -> None:
        """One snippet, from its files to its fetched files; writes the response on fd 1.

        `code` None (the zygote's own path, no files to write or fetch): the child reads the code and stdin from
        fd 0 itself. Output is read into the preallocated buffers, written out from them and zeroed, so none of
        it stays in this process for a later fork to find.
        """
        if not self._make_rundir(rundir, extra.get("files")):
            return
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        child.fresh_state(rundir)
        self._reset_pids()
        t0 = time.monotonic()
        pid = _raw_fork()
        if pid == 0:
            child.snippet_process(
                req,
                code,
                stdin,
                out_w,
                err_w,
                rundir,
                cfg=self.cfg,
                base_vm=self.base_vm,
                oom_protected=self.oom_protected,
                libc=self._libc,
            )
        for fd in (out_w, err_w):
            os.close(fd)
        pidfd = os.pidfd_open(pid)
        pidns, cap, deadline = self.cfg["pidns"], self.cfg["max_output_bytes"], t0 + req[2]
        n_out, n_err, flags = supervise.collect(self._views, cap, pidns, pid, pidfd, out_r, err_r, deadline)
        used = (n_out + 1, n_err + 1, supervise.CHUNK if flags & wire.F_TRUNCATED else 0)
        # the loop may have ended on EOF with a background process still running
        supervise.kill_all(pidns, 0.0, pid)
        _, wstatus = os.waitpid(pid, 0)
        wall = time.monotonic() - t0
        for fd in (out_r, err_r, pidfd):
            os.close(fd)
        supervise.reap(pidns)
        fetched = self._fetched(rundir, extra.get("fetch"))  # every process of the run is dead
        code_ = os.waitstatus_to_exitcode(wstatus)
        if code_ == -signal.SIGKILL and not flags & (wire.F_TIMEOUT | wire.F_TRUNCATED):
            flags |= wire.F_KILLED  # not by us: the host checks the memory cgroup's OOM counter
        try:
            wire.write_all(1, wire.RESP.pack(code_, flags, wall, n_out, n_err, len(fetched)))
            wire.write_all(1, self._views[0][:n_out])
            wire.write_all(1, self._views[1][:n_err])
            wire.write_all(1, fetched)
        finally:
            for buf, n in zip(self._bufs, used, strict=False):  # the header buffer: zeroed on reading
                ctypes.memset(buf, 0, min(n, len(buf)))

    def _make_rundir(self, rundir: str, files: dict | None) -> bool:
        """The run's directory, fresh and the snippet's, with the request's `files` in it; False when they cannot be
        written, the request's error already replied."""
        try:
            os.mkdir(rundir, 0o700)
        except FileExistsError:  # left by a killed worker that had our pid (isolation none)
            shutil.rmtree(rundir, ignore_errors=True)
            os.mkdir(rundir, 0o700)
        if self.uid >= 0:
            os.chown(rundir, self.uid, self.uid)
        if files:
            try:
                runfiles.restore(rundir, files, self.uid)
            except (OSError, ValueError, RecursionError) as e:  # the request's (a full tmpfs...): its error
                err = f"tirl sandbox: could not write the request's files: {e}\n".encode()
                wire.write_all(1, wire.RESP.pack(1, 0, 0.0, 0, len(err), 0) + err)
                return False
        return True

    def _fetched(self, rundir: str, fetch: list | None) -> bytes:
        """The reply's extra frame: the run's `fetch_files` (read once every process of the run is dead, so no
        symlink can change under us), or nothing."""
        if not fetch:
            return b""
        files, skipped = runfiles.fetch(
            rundir, fetch, self.cfg["max_fetch_bytes"], self.cfg["max_file_bytes"]
        )
        return json.dumps({"files": files, "skipped": skipped}).encode()

    def serve(self) -> None:
        """Per request: the header (numbers only) read here into a buffer zeroed after use; a request without
        `files`/`fetch_files` runs from here, its child reading its code and stdin itself; one with them goes to a
        runner, forked first, which reads the rest. Either way the reply comes first, then the wipe (a wiper
        forked only when the snippet left files: it lists their names), then the ready byte."""
        max_runs = self.cfg["max_runs"]
        head = self._views[3]
        wire.write_all(1, wire.READY)
        while max_runs <= 0 or self.n < max_runs:
            self.n += 1
            try:
                _read_into(0, head)
            except EOFError:
                return
            req = wire.REQ.unpack_from(head)
            ctypes.memset(self._bufs[3], 0, wire.REQ.size)
            # one name for every run (the last one's is gone by now): a count in it would tell how many ran before;
            # the pid keeps workers apart on a shared /tmp (isolation none)
            rundir = f"/tmp/tirl-run-{os.getpid()}"
            if req[5]:
                self._in_runner(self.runner, req, rundir)
            else:
                self.run(rundir, req, None, None, {})
                if _unread(0):
                    sys.exit("zygote: a run left part of its request unread")  # the host replaces this worker
                if not runfiles.is_clean(rundir, self._tmp_sizes):
                    self._in_runner(runfiles.wipe, rundir, self.cfg)
            for d, times in self._tmp_times:  # when the last run wrote there is no later tenant's business
                try:
                    os.utime(d, ns=times)
                except OSError:
                    pass
            if self.n != max_runs:  # the last run: we exit, the host replaces the worker
                wire.write_all(1, wire.READY)

    def _in_runner(self, fn: object, *args: object) -> None:
        """fn(*args) in a forked runner, a child subreaper (the snippet's orphans are its to reap, and kill(-1)
        there spares it and us), which exits with what it read; a runner that fails ends this worker."""
        self._reset_pids()
        pid = _raw_fork()
        if pid == 0:
            status = 1
            try:
                if self._prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
                    raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")
                fn(*args)
                status = 0
            except EOFError:  # the host went away mid-request
                status = _RUNNER_EOF
            except BaseException:
                child.print_exc_quietly()
            finally:
                os._exit(status)
        _, wstatus = os.waitpid(pid, 0)
        status = os.waitstatus_to_exitcode(wstatus)
        if status != 0:
            if self.cfg["pidns"]:  # a runner that died mid-run leaves its snippet to us (pid 1)
                supervise.kill_all(True, 0.0, 0)
            supervise.reap(self.cfg["pidns"])
            sys.exit(0 if status == _RUNNER_EOF else f"zygote: the runner failed (status {status})")

    def runner(self, req: tuple, rundir: str) -> None:
        """In a runner: read the rest of a request with `files` or `fetch_files`, run it, reply, wipe."""
        code_len, stdin_len, _timeout, _mem_mb, _cpu_s, extra_len = req
        code = wire.read_exact(0, code_len)
        stdin = None if stdin_len == wire.NO_STDIN else wire.read_exact(0, stdin_len)
        extra = json.loads(wire.read_exact(0, extra_len))
        self.run(rundir, req, code, stdin, extra)
        runfiles.wipe(rundir, self.cfg)


def _times(path: str) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_atime_ns, st.st_mtime_ns


def _read_into(fd: int, view: memoryview) -> None:
    """Fill `view` from `fd` (no bytes object: the request's header stays in a buffer we zero)."""
    got = 0
    while got < len(view):
        n = os.readv(fd, [view[got:]])
        if not n:
            raise EOFError
        got += n


def _unread(fd: int) -> bool:
    """Bytes waiting on `fd`: the host sends a request only after the ready byte, so these are the last run's."""
    p = select.poll()
    p.register(fd, select.POLLIN)
    return any(ev & select.POLLIN for _, ev in p.poll(0))


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
