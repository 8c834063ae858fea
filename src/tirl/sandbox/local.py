"""Run model-written Python in a short-lived local process with resource limits; a first line of defence only.

What each run gets (every property has its own test in tests/sandbox/test_local_sandbox.py):
  - a fresh interpreter (`python -I -u -B -X utf8 [-S]`), so no state leaks between runs through the process;
  - a fresh empty working directory (also HOME and TMPDIR), removed afterwards, even after a timeout;
  - a scrubbed environment: PATH, HOME, TMPDIR, locale and thread-count variables, nothing from the parent;
  - rlimits on CPU time, address space (so large allocations raise MemoryError), file size, no core dumps;
  - a wall-clock timeout and per-stream output caps that kill the whole process group (the run is its own
    session), and a kill of that group once the main process exits, so children from fork/Popen die too;
  - stdin from a string or /dev/null; output decoded as UTF-8 with undecodable bytes replaced.

What it does NOT cover (a later issue adds namespaces and cgroups):
  - the filesystem is the host's: absolute paths (/tmp, ~root, the repo) are readable and, as root, writable;
  - the network is open;
  - a child that calls setsid()/setpgid() leaves the process group and survives the run;
  - process count is not limited (RLIMIT_NPROC does not bind root), so a fork bomb is not contained;
  - RLIMIT_AS bounds virtual memory per process, not the total of a process tree.
Run it only on a machine you are prepared to lose, and never with credentials in reach.

The rlimits are applied in a `preexec_fn`, which forces fork() instead of vfork(): starting a run from a
parent with a large address space (a trainer holding a model) costs more page-table copying.
"""

from __future__ import annotations

import contextlib
import os
import resource
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from tirl.sandbox.types import ExecResult

_PATH = "/usr/local/bin:/usr/bin:/bin"
_READ_CHUNK = 65536
_POLL_S = 0.05  # how often the main process's exit is checked while its children may hold the pipes open
_DRAIN_S = 0.5  # after the group is killed, how long to wait for the pipes to close

# Runs in the child: executes snippet.py as __main__ under the name "snippet.py" (tracebacks show its source
# lines but neither this bootstrap's frames nor a temporary path), and exits with 1 on an uncaught exception.
_BOOTSTRAP = r"""
def _tirl_run():
    import builtins, linecache, sys, traceback
    path = sys.argv[1]
    with open(path, encoding="utf-8") as f:
        src = f.read()
    sys.argv[:] = ["snippet.py"]
    linecache.cache["snippet.py"] = (len(src), None, src.splitlines(True), "snippet.py")
    if not hasattr(builtins, "exit"):  # without site, exit() and quit() do not exist
        builtins.exit = builtins.quit = sys.exit
    namespace = sys.modules["__main__"].__dict__
    del namespace["_tirl_run"]
    namespace["__file__"] = "snippet.py"
    try:
        exec(compile(src, "snippet.py", "exec"), namespace)
    except SystemExit:
        raise
    except BaseException as e:
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename == "<string>":
            tb = tb.tb_next
        traceback.print_exception(type(e), e, tb)
        sys.exit(1)
_tirl_run()
"""


@dataclass
class SandboxConfig:
    """Limits of one run. Memory and file limits are per process; the timeout is wall clock for the run."""

    timeout_s: float = 5.0
    cpu_time_s: int = 5
    memory_mb: int = 1024
    max_output_bytes: int = 65536  # per stream
    max_file_bytes: int = 16 * 2**20
    max_workers: int = 0  # threads for run_batch; 0 = 2 x CPU count (runs mostly wait on their processes)
    python: str = ""  # interpreter; "" = the one running tirl
    import_site: bool = True  # False passes -S: faster start, but no site-packages (no numpy, sympy)

    def __post_init__(self) -> None:
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")
        if self.cpu_time_s < 1:
            raise ValueError(f"cpu_time_s must be >= 1 (rlimits count whole seconds), got {self.cpu_time_s}")
        if self.memory_mb < 32:
            raise ValueError(
                f"memory_mb must be >= 32 (the interpreter alone needs ~20 MB), got {self.memory_mb}"
            )
        if self.max_output_bytes < 1:
            raise ValueError(f"max_output_bytes must be >= 1, got {self.max_output_bytes}")
        if self.max_file_bytes < 0:
            raise ValueError(f"max_file_bytes must be >= 0, got {self.max_file_bytes}")
        if self.max_workers < 0:
            raise ValueError(f"max_workers must be >= 0 (0 = 2 x CPU count), got {self.max_workers}")
        if self.python and shutil.which(self.python) is None:
            raise ValueError(f"python interpreter {self.python!r} not found or not executable")


def _scrubbed_env(home: str) -> dict[str, str]:
    # -I makes the sandboxed interpreter ignore PYTHON* variables; they are for the processes it may start.
    return {
        "PATH": _PATH,
        "HOME": home,
        "TMPDIR": home,
        "LANG": "C.UTF-8",
        "PYTHONIOENCODING": "utf-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }


def _rlimit_setter(config: SandboxConfig) -> Callable[[], None]:
    """Limits computed in the parent; the returned function only calls setrlimit (between fork and exec)."""
    wanted = [
        # soft CPU limit sends SIGXCPU; the hard limit one second later is SIGKILL for snippets that catch it
        (resource.RLIMIT_CPU, config.cpu_time_s, config.cpu_time_s + 1),
        (resource.RLIMIT_AS, config.memory_mb * 2**20, config.memory_mb * 2**20),
        (resource.RLIMIT_FSIZE, config.max_file_bytes, config.max_file_bytes),
        (resource.RLIMIT_CORE, 0, 0),
    ]
    limits = []
    for res, soft, hard in wanted:
        current_hard = resource.getrlimit(res)[1]
        if current_hard != resource.RLIM_INFINITY:  # cannot raise a hard limit without privileges
            soft, hard = min(soft, current_hard), min(hard, current_hard)
        limits.append((res, (soft, hard)))

    def apply() -> None:
        for res, lim in limits:
            resource.setrlimit(res, lim)

    return apply


def _has_exited(proc: subprocess.Popen) -> bool:
    """True once the main process has exited; it is not reaped, so its pid still names the process group."""
    try:
        return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # start_new_session: the group id is the main pid
    with contextlib.suppress(ProcessLookupError):
        proc.kill()  # in case the main process left its own group


def _remove_tree(path: str) -> None:
    """Remove a run's directory even if the snippet took the write bit off its own files."""

    def retry(func: Callable[[str], object], p: str, *_: object) -> None:
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(p), 0o700)
            func(p)

    if sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=retry)
    else:
        shutil.rmtree(path, onerror=retry)


class LocalSandbox:
    """Runs snippets in fresh subprocesses; `run` never raises on bad code: everything is an ExecResult."""

    def __init__(self, config: SandboxConfig | None = None) -> None:
        self.config = config or SandboxConfig()
        self._python = self.config.python or sys.executable
        self._preexec = _rlimit_setter(self.config)
        self._flags = ["-I", "-u", "-B", "-X", "utf8"] + ([] if self.config.import_site else ["-S"])
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._closed = False

    def run(self, code: str, *, stdin: str | None = None, timeout_s: float | None = None) -> ExecResult:
        """Execute `code` as a script; `timeout_s` overrides the configured wall-clock limit for this run."""
        timeout = self.config.timeout_s if timeout_s is None else timeout_s
        if not timeout > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout}")
        start = time.monotonic()
        root = tempfile.mkdtemp(prefix="tirl-sbx-")
        try:
            return self._run_in(Path(root), code, stdin, timeout, start)
        except Exception as e:  # the sandbox failed (e.g. no interpreter); report it instead of raising
            return ExecResult(
                "", "", None, False, False, time.monotonic() - start, f"{type(e).__name__}: {e}"
            )
        finally:
            _remove_tree(root)

    def _run_in(self, root: Path, code: str, stdin: str | None, timeout: float, start: float) -> ExecResult:
        work = root / "work"
        work.mkdir()
        script = root / "snippet.py"  # outside the working directory, which starts empty
        script.write_text(code, encoding="utf-8", errors="replace")
        with contextlib.ExitStack() as stack:
            if stdin is None:
                stdin_file: IO[bytes] = stack.enter_context(open(os.devnull, "rb"))
            else:
                (root / "stdin.txt").write_text(stdin, encoding="utf-8", errors="replace")
                stdin_file = stack.enter_context(open(root / "stdin.txt", "rb"))
            proc = subprocess.Popen(
                [self._python, *self._flags, "-c", _BOOTSTRAP, str(script)],
                stdin=stdin_file,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=work,
                env=_scrubbed_env(str(work)),
                start_new_session=True,
                preexec_fn=self._preexec,
            )
            try:
                out, err, timed_out, truncated = self._collect(proc, timeout)
            finally:
                _kill_group(proc)  # before reaping, so the group id cannot have been reused
                proc.wait()
                for stream in (proc.stdout, proc.stderr):
                    if stream is not None:
                        stream.close()
        return ExecResult(
            stdout=out.decode("utf-8", errors="replace"),
            stderr=err.decode("utf-8", errors="replace"),
            exit_code=proc.returncode,
            timed_out=timed_out,
            output_truncated=truncated,
            wall_time=time.monotonic() - start,
        )

    def _collect(self, proc: subprocess.Popen, timeout: float) -> tuple[bytes, bytes, bool, bool]:
        """Read both pipes up to the cap until they close; kill the group on timeout, overflow, main exit."""
        cap = self.config.max_output_bytes
        bufs = {"stdout": bytearray(), "stderr": bytearray()}
        timed_out = truncated = False
        deadline = time.monotonic() + timeout
        drain_until: float | None = None  # set once the group is killed: pipes should close at once
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ, "stdout")
            sel.register(proc.stderr, selectors.EVENT_READ, "stderr")
            while sel.get_map():
                now = time.monotonic()
                if drain_until is None:
                    exited = _has_exited(proc)
                    if exited or now >= deadline:
                        timed_out = not exited
                        _kill_group(proc)  # also ends background children still holding the pipes
                        drain_until = now + _DRAIN_S
                if drain_until is not None and now >= drain_until:
                    break  # a child that left the group still holds a pipe
                until = deadline if drain_until is None else drain_until
                for key, _ in sel.select(max(0.0, min(until - now, _POLL_S))):
                    chunk = os.read(key.fd, _READ_CHUNK)
                    if not chunk:
                        sel.unregister(key.fileobj)
                        continue
                    buf = bufs[key.data]
                    room = cap - len(buf)
                    buf += chunk[:room]
                    if len(chunk) > room and not truncated:
                        truncated = True
                        _kill_group(proc)
                        if drain_until is None:
                            drain_until = time.monotonic() + _DRAIN_S
        return bytes(bufs["stdout"]), bytes(bufs["stderr"]), timed_out, truncated

    def run_batch(
        self,
        codes: Sequence[str],
        *,
        stdins: Sequence[str | None] | None = None,
        timeout_s: float | None = None,
    ) -> list[ExecResult]:
        """Run snippets in parallel threads (each waits on its own process); results in input order.

        `stdins`, if given, holds one stdin text (or None) per snippet, as code tests with stdin/stdout need.
        """
        if stdins is not None and len(stdins) != len(codes):
            raise ValueError(f"run_batch: {len(codes)} snippets but {len(stdins)} stdins")
        pool = self._executor()
        inputs = stdins if stdins is not None else [None] * len(codes)
        return list(pool.map(lambda c, s: self.run(c, stdin=s, timeout_s=timeout_s), codes, inputs))

    def _executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._closed:
                raise RuntimeError("LocalSandbox is closed")
            if self._pool is None:
                workers = self.config.max_workers or (os.cpu_count() or 1) * 2
                self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tirl-sandbox")
            return self._pool

    def close(self) -> None:
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)

    def __enter__(self) -> LocalSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
