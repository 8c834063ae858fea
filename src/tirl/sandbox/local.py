"""Run model-written Python in a pool of warm workers, each inside its own isolation boundary.

A worker is `worker/zygote.py`, started once per slot inside bubblewrap (default), `unshare`, or nothing, with some
modules imported; it forks once per snippet, so a short run costs a fork instead of an interpreter start.
Host and worker talk over a pipe with a fixed binary header. A worker is replaced after any run that ended in a
kill (timeout, output flood, memory) or crashed it, and after `max_runs_per_worker` runs.

Workers come in two tiers, because a fork of a zygote holding numpy and sympy costs ~5x one holding only math
(page tables and teardown of a larger address space). The light tier preloads `sandbox.preload` (math) and
starts with the pool; the heavy tier also preloads `sandbox.preload_heavy` (numpy, sympy) and starts on the
first snippet that imports one of those (routing.py: a regex on the host, microseconds per snippet), so a pool
that never sees numpy never pays for it. Each tier has `max_workers` workers (0 = CPU count) and its own idle
queue; both tiers are built by the same code path with the same isolation, cgroups, uid switch, per-run wipe
and recycling. Routing only changes speed: a light-tier snippet that imports sympy dynamically just imports it.
The bound on waiting runs (`max_queue`, SandboxOverloaded, HTTP 429) counts the runs waiting for either tier.

What a run gets with `isolation: bwrap` (each property has an adversarial test in tests/sandbox/):
  - its own pid namespace (the worker is its init): children, daemons and setsid() escapes are SIGKILLed when
    the run ends, and /proc shows no host process, so other processes' environments are out of reach;
  - its own network namespace with nothing in it: no network, not even the host's loopback services;
  - of the host's files only /usr, the interpreter's directories, the worker's code and a few /etc files, all
    read-only (mounts.py: no /work, /home, /var, /etc/passwd); a fresh tmpfs /tmp and a writable private
    /dev/shm (multiprocessing's locks and Pool work), both wiped after each run, and a fresh empty working
    directory (also HOME and TMPDIR) holding the request's `files`, deleted after the run (`fetch_files` are
    read back first, never through a symlink leading out of it);
  - a seccomp filter (seccomp.py; loaded by the zygote, inherited by each fork): ptrace, mount, kexec, bpf, perf_event_open, keyctl,
    unshare/setns/clone with namespace flags (new user namespaces above all), raw and packet sockets, io_uring,
    module loading, System V IPC and POSIX message queues, and other calls no snippet needs fail with EPERM;
  - a scrubbed environment (PATH, locale, thread counts; HOME/TMPDIR set per run), nothing from the parent;
  - nothing of an earlier request: the worker reads only request headers, each run's child reads its own code
    and stdin, output passes through buffers zeroed after the reply, and `files`/`fetch_files` requests and
    leftover files are handled by short-lived forks (worker/zygote.py), so no snippet (a fork of the worker)
    finds another request's code, stdin, output or files in its memory; the reply comes before the wipe, and a
    worker that has not finished wiping within _CLEAN_S when the next run wants it is replaced;
  - `files` checked on the host (files.py: count, lengths, depth, file-versus-folder) and `fetch_files` bounded by
    `max_fetch_bytes` per run, every listed path counted (what does not fit is named in `files_skipped`);
  - when tirl runs as root: the snippet switches to an unprivileged uid of its own, so it cannot signal the
    worker, read 0700 files or write root-owned ones, and RLIMIT_NPROC binds; /proc hides the worker from it
    (hidepid) and every run gets the same pids (the pid counter is set back before each fork);
  - rlimits: CPU time (the run's timeout + 1 s unless `cpu_time_s` fixes it), address space (warm interpreter +
    memory_mb), file size, process count, no core dumps;
  - per-worker cgroups (pids.max, memory limit = memory_mb + 512 MiB) in the v1 hierarchies where writable, else
    in the v2 unified one where it delegates memory and pids: a fork bomb stops at the process limit, memory
    spread over many processes meets the OOM killer (reported as memory_exceeded when it kills the main process);
  - a wall-clock timeout and per-stream output caps (truncated and flagged; the run is killed, never buffered
    without bound); non-UTF-8 output decoded with replacement characters.

What it does NOT cover:
  - kernel exploits through the syscalls the filter allows: namespaces share the host kernel (no VM); use a VM
    for that threat;
  - `unshare` mode (pid, net, ipc, uts, mount namespaces, private /tmp and /dev/shm; /var/tmp too as root) keeps
    the rest of the host filesystem as readable as it is for the snippet's uid, and writable without root; as
    root, the snippet switches to its own uid only where that uid can read the interpreter, and otherwise runs
    as root, with a loud warning at start (isolation.unprivileged_uid_can_run);
    `none` mode has no namespaces at all (only rlimits, setsid and process-group kills: setsid escapes survive,
    the network and filesystem are open); it needs the explicit opt-in and logs a loud warning;
  - without root, the snippet runs as the worker's uid: RLIMIT_NPROC counts all of that uid's processes; the
    worker is not dumpable (its /proc/1/mem, fd and environ refuse the snippet) and the snippet holds no
    capability; ptrace is filtered; signals cannot reach the worker, the namespace's init; a worker that dies
    anyway is replaced and that run reports a sandbox_error. Under bwrap the worker's CPU counters in
    /proc/1/stat and the pid counter stay readable (docs/sandbox.md: what a tenant can learn of earlier ones);
  - the preloaded modules are shared, read-only state; the string hash is fixed (PYTHONHASHSEED=0 in every
    worker, so a printed set has one order on every run), while `random` and numpy are reseeded per run;
  - CPU share between concurrent runs is not limited (no cpu cgroup): a busy snippet slows its neighbours;
  - there is no per-run disk quota beyond the file-size rlimit and the worker's /tmp and /dev/shm tmpfs sizes;
  - cgroup v2 is used only where this process's cgroup can give children the memory and pids controllers: the
    root, or a cgroup holding tirl alone (tirl then moves itself into a `tirl-host` leaf, as delegated services
    do); a cgroup shared with other processes (a login session's scope) cannot, and `cgroups: auto` then runs
    without cgroups (`required` refuses, saying why);
  - the worker's OOM protection (oom_score_adj) is best effort: some kernels and VMs refuse it.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import queue
import sys
import threading
import time
import warnings
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from tirl.sandbox.config import SandboxConfig
from tirl.sandbox.files import file_request
from tirl.sandbox.isolation import (
    ZYGOTE,
    SandboxUnavailable,
    WorkerCgroup,
    cgroup_support,
    kept_tmp_entries,
    remove_stale_cgroups,
    snippet_uid,
    unprivileged_uid_can_run,
    worker_cgroup_name,
    worker_command,
)
from tirl.sandbox.routing import heavy_import_pattern, needs_heavy
from tirl.sandbox.seccomp import compile_filter
from tirl.sandbox.types import ExecResult, batch_stdins
from tirl.sandbox.worker import wire as proto
from tirl.sandbox.worker_proc import Tier, WorkerDied, WorkerProcess

__all__ = ["LocalSandbox", "SandboxConfig", "SandboxOverloaded", "SandboxUnavailable"]

_READY_TIMEOUT_S = 120.0  # a worker's start: namespaces plus importing sympy on a loaded machine
_MAX_TIMEOUT_S = 86400.0  # a day: per-run timeouts above this are surely a unit mistake
_MAX_MEMORY_MB = 2**20  # 1 TiB; the wire header holds 32 bits
_GRACE_S = 5.0  # beyond a run's timeout before the host gives up on a silent worker
_CLEAN_S = 2.0  # how long a run waits for a worker to finish wiping the previous run before replacing it


class SandboxOverloaded(RuntimeError):
    """More runs are waiting than `max_queue` allows; the caller should back off (the server answers 429)."""


class LocalSandbox:
    """A warm pool of isolated workers; `run` never raises on bad code: everything is an ExecResult."""

    def __init__(self, config: SandboxConfig | None = None) -> None:
        self.config = cfg = config or SandboxConfig()
        if cfg.isolation == "none":
            warnings.warn(
                "tirl sandbox: isolation 'none' runs model-written code WITHOUT namespaces: it can read and "
                "write your files and use the network. Use it only on a machine you are prepared to lose.",
                RuntimeWarning,
                stacklevel=2,
            )
        self._python = cfg.python or sys.executable
        self._switch_uid = cfg.isolation == "bwrap"  # as root, each slot's snippets get their own uid
        if cfg.isolation == "unshare" and os.geteuid() == 0:
            why = unprivileged_uid_can_run(self._python, str(ZYGOTE), snippet_uid(0))
            self._switch_uid = not why
            if why:
                warnings.warn(
                    f"tirl sandbox: isolation 'unshare' as root runs model-written code AS ROOT (uid 0): it can "
                    f"read and write every file outside its private /tmp, /var/tmp and /dev/shm. An unprivileged "
                    f"uid would be used, but {why}. Use isolation 'bwrap', or an interpreter every user can read "
                    f"(e.g. a virtualenv outside /root, `chmod o+rx` on its directories).",
                    RuntimeWarning,
                    stacklevel=2,
                )
        per_tier = cfg.max_workers or max(2, os.cpu_count() or 1)
        self._light = Tier("light", tuple(cfg.preload), range(per_tier), started=True)
        self._heavy: Tier | None = None
        if cfg.preload_heavy:
            preload = tuple(cfg.preload) + tuple(cfg.preload_heavy)
            self._heavy = Tier("heavy", preload, range(per_tier, 2 * per_tier), started=False)
        self._pattern = heavy_import_pattern(cfg.preload_heavy)
        self._seccomp_bpf = compile_filter() if cfg.seccomp else b""  # SandboxUnavailable without libseccomp
        self.workers = per_tier * (2 if self._heavy else 1)  # all tiers, started or not
        self.cgroup_version, why = (
            cgroup_support() if cfg.cgroups != "off" else ("", "sandbox.cgroups is off")
        )
        self._use_cgroups = bool(self.cgroup_version)
        if cfg.cgroups == "required" and not self._use_cgroups:
            raise SandboxUnavailable(f"sandbox.cgroups 'required' but no cgroups are usable: {why}")
        if self._use_cgroups:  # those of pools killed with -9 (no cleanup ran), and their workers, go now
            with contextlib.suppress(OSError):
                remove_stale_cgroups(self.cgroup_version)
        self._lock = threading.Lock()
        self._waiting = 0
        self._closed = False
        self._all: set[WorkerProcess] = set()
        self._last_spawn_error = ""
        self._batch_pool: ThreadPoolExecutor | None = None
        # All spawns happen on this one long-lived thread: bwrap's --die-with-parent follows the spawning thread.
        self._spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tirl-sandbox-spawn")
        try:
            # refuse to start if isolation fails
            first = self._spawner.submit(self._spawn, self._light, 0, True).result()
        except WorkerDied as e:
            self._spawner.shutdown()
            raise SandboxUnavailable(f"sandbox isolation {cfg.isolation!r} does not work here: {e}") from None
        self._light.idle.put(first)
        for slot in self._light.slots[1:]:
            self._spawner.submit(self._spawn, self._light, slot)

    # -- workers ------------------------------------------------------------------------------------------
    def _spawn(
        self, tier: Tier, slot: int, raise_errors: bool = False, attempt: int = 0
    ) -> WorkerProcess | None:
        cfg = self.config
        root = os.geteuid() == 0
        zcfg = {
            # unshare as root: only where an unprivileged uid can read the interpreter (see __init__)
            "uid": snippet_uid(slot) if self._switch_uid else -1,
            "pidns": cfg.isolation != "none",
            "private_tmp": cfg.isolation != "none",  # /tmp and /dev/shm are the worker's own tmpfs
            "wipe_dirs": ["/tmp", "/dev/shm"] + (["/var/tmp"] if cfg.isolation == "unshare" and root else []),
            "keep_tmp": [],  # set below (it can fail: a vanished interpreter)
            "preload": list(tier.preload),
            "seccomp_bpf": self._seccomp_bpf.hex(),
            "memory_mb": cfg.memory_mb,
            "max_file_bytes": cfg.max_file_bytes,
            "max_fetch_bytes": cfg.max_fetch_bytes,
            "max_output_bytes": cfg.max_output_bytes,
            "max_processes": cfg.max_processes,
            "max_runs": cfg.max_runs_per_worker,
        }
        cgroup = None
        try:
            # a checkout under /tmp, bound back; OSError when the interpreter cannot be asked
            zcfg["keep_tmp"] = kept_tmp_entries(self._python, str(ZYGOTE))
            argv = worker_command(cfg, self._python, json.dumps(zcfg))
            if self._use_cgroups:
                cgroup = WorkerCgroup(
                    worker_cgroup_name(slot),
                    pids_max=cfg.max_processes + 8,
                    memory_bytes=(cfg.memory_mb + 512) * 2**20,  # + the warm interpreter and the run's tmpfs
                    version=self.cgroup_version,
                )
                argv = cgroup.enter_command() + argv
            worker = WorkerProcess(
                tier, slot, argv, cgroup, ready_s=_READY_TIMEOUT_S, clean_s=_CLEAN_S, grace_s=_GRACE_S
            )
        except (WorkerDied, OSError, SandboxUnavailable) as e:
            if cgroup is not None:
                cgroup.close()
            self._last_spawn_error = str(e)
            if raise_errors:
                raise WorkerDied(str(e)) from None
            time.sleep(min(5.0, 0.1 * 2**attempt))  # a transient failure (fork, memory): try again, slower
            if not self._closed:
                with contextlib.suppress(RuntimeError):  # the spawner is shutting down
                    self._spawner.submit(self._spawn, tier, slot, False, attempt + 1)
            return None
        with self._lock:
            if self._closed:
                worker.kill()
                return None
            self._all.add(worker)
            tier.alive += 1
            if not raise_errors:  # under the lock: stats() never counts a fresh worker as busy
                tier.idle.put(worker)
        return worker

    def _retire(self, worker: WorkerProcess) -> None:
        with self._lock:
            if worker in self._all:
                worker.tier.alive -= 1
                worker.tier.recycles += 1
            self._all.discard(worker)
            closed = self._closed
        worker.kill()
        if not closed:
            with contextlib.suppress(RuntimeError):  # shutting down
                self._spawner.submit(self._spawn, worker.tier, worker.slot)

    # -- runs ---------------------------------------------------------------------------------------------
    def run(
        self,
        code: str,
        *,
        stdin: str | None = None,
        timeout_s: float | None = None,
        memory_mb: int | None = None,
        files: dict[str, str | None] | None = None,
        fetch_files: Sequence[str] = (),
    ) -> ExecResult:
        """Execute `code` as a script; `timeout_s` and `memory_mb` override the configured limits for this run.

        `files` (relative path -> base64) are written into the run's directory first; `fetch_files` (relative
        paths) come back base64 in the result's `files` when they exist after the run (SandboxFusion's fields).
        """
        timeout = self.config.timeout_s if timeout_s is None else timeout_s
        if not 0 < timeout <= _MAX_TIMEOUT_S:  # beyond, the pipes' poll() overflows its millisecond count
            raise ValueError(f"timeout_s must be > 0 and <= {_MAX_TIMEOUT_S:.0f}, got {timeout}")
        if memory_mb is not None and not 1 <= memory_mb <= _MAX_MEMORY_MB:
            raise ValueError(
                f"memory_mb must be 1-{_MAX_MEMORY_MB} (None = the configured limit), got {memory_mb}"
            )
        extra = file_request(files or {}, fetch_files)
        start = time.monotonic()
        tier = self._heavy if self._heavy is not None and needs_heavy(code, self._pattern) else self._light
        with self._lock:
            if self._closed:
                raise RuntimeError("LocalSandbox is closed")
            if self._waiting >= self.workers + self.config.max_queue:
                raise SandboxOverloaded(f"{self._waiting} runs already waiting for {self.workers} workers")
            self._waiting += 1
            tier.runs += 1
            start_tier, tier.started = not tier.started, True
        if start_tier:
            for slot in tier.slots:
                with contextlib.suppress(RuntimeError):  # closing
                    self._spawner.submit(self._spawn, tier, slot)
        try:
            while True:
                try:
                    worker = tier.idle.get(timeout=_READY_TIMEOUT_S)
                except queue.Empty:
                    msg = f"no sandbox worker ready after {_READY_TIMEOUT_S:.0f} s: {self._last_spawn_error}"
                    return ExecResult("", "", None, False, False, time.monotonic() - start, msg)
                if worker is None:  # closed while waiting: pass the wake-up on to the next waiter
                    tier.idle.put(None)
                    raise RuntimeError("LocalSandbox is closed")
                if worker.proc.poll() is None and worker.wait_ready():
                    break
                # died while idle (killed from outside), or still wiping a run's mass of files: not this run's
                # fault; the replacement starts with an empty /tmp and /dev/shm
                self._retire(worker)
        finally:
            with self._lock:
                self._waiting -= 1
        return self._run_on(worker, code, stdin, timeout, memory_mb or 0, start, extra)

    def _run_on(
        self,
        worker: WorkerProcess,
        code: str,
        stdin: str | None,
        timeout: float,
        memory_mb: int,
        start: float,
        extra: bytes = b"",
    ) -> ExecResult:
        data = code.encode("utf-8", errors="replace")
        stdin_b = None if stdin is None else stdin.encode("utf-8", errors="replace")
        cpu_s = self.config.cpu_time_s or math.ceil(timeout) + 1  # the wall clock normally fires first
        try:
            exit_code, flags, wall, out, err, fetched = worker.execute(
                data, stdin_b, timeout, memory_mb, cpu_s, extra
            )
        except WorkerDied as e:
            self._retire(worker)
            return ExecResult("", "", None, False, False, time.monotonic() - start, f"sandbox worker: {e}")
        except BaseException:  # never lose a worker from the pool (its protocol state is unknown: replace it)
            self._retire(worker)
            raise
        fetched_files = json.loads(fetched) if fetched else {}
        killed = flags & (proto.F_TIMEOUT | proto.F_TRUNCATED | proto.F_KILLED) or exit_code < 0
        oom = bool(flags & proto.F_KILLED) and worker.cgroup is not None and worker.cgroup.oom_kills() > 0
        if killed or worker.runs >= self.config.max_runs_per_worker:
            self._retire(worker)
        else:
            worker.tier.idle.put(worker)
        return ExecResult(
            stdout=out.decode("utf-8", errors="replace"),
            stderr=err.decode("utf-8", errors="replace"),
            exit_code=exit_code,
            timed_out=bool(flags & proto.F_TIMEOUT),
            output_truncated=bool(flags & proto.F_TRUNCATED),
            wall_time=wall,
            memory_exceeded=oom,
            files=fetched_files.get("files", {}),
            files_skipped=fetched_files.get("skipped", {}),
        )

    def run_batch(
        self,
        codes: Sequence[str],
        *,
        stdins: Sequence[str | None] | None = None,
        timeout_s: float | None = None,
    ) -> list[ExecResult]:
        """Run snippets on all workers at once; results in input order, one stdin (or None) per snippet."""
        inputs = batch_stdins(codes, stdins)
        with self._lock:
            if self._closed:
                raise RuntimeError("LocalSandbox is closed")
            if self._batch_pool is None:
                self._batch_pool = ThreadPoolExecutor(self.workers, thread_name_prefix="tirl-sandbox")
            pool = self._batch_pool
        return list(pool.map(lambda c, s: self.run(c, stdin=s, timeout_s=timeout_s), codes, inputs))

    def stats(self) -> dict[str, int]:
        """Queue depth and pool size for /metrics; per tier: idle and busy workers, workers recycled, runs routed
        there (`heavy_*`: 0 without a heavy tier)."""
        with self._lock:
            out = {"waiting": self._waiting, "workers": self.workers}
            for name, tier in (("light", self._light), ("heavy", self._heavy)):
                idle = tier.idle.qsize() if tier else 0
                out[f"{name}_idle"] = idle
                out[f"{name}_busy"] = max(0, tier.alive - idle) if tier else 0
                out[f"{name}_recycles"] = tier.recycles if tier else 0
                out[f"{name}_runs"] = tier.runs if tier else 0
            out["idle"] = out["light_idle"] + out["heavy_idle"]
            return out

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            pool, self._batch_pool = self._batch_pool, None
        if pool is not None:
            pool.shutdown(wait=True)
        self._spawner.shutdown(wait=True)
        with self._lock:
            workers, self._all = list(self._all), set()
        for w in workers:
            w.kill()
        # wake the runs still waiting for a worker (they would otherwise wait out _READY_TIMEOUT_S)
        for tier in (self._light, self._heavy):
            if tier is not None:
                tier.idle.put(None)

    def __enter__(self) -> LocalSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()
