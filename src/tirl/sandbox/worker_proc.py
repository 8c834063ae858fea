"""One warm worker as the host sees it: the zygote's process, its pipes and the protocol's host side (wire.py).

The pool (local.py) decides when a worker starts, runs, waits and is replaced, and how long each may take: it
gives each worker those timeouts when it spawns it, so that they are set in one place.
"""

from __future__ import annotations

import contextlib
import os
import queue
import select
import subprocess
import time

from tirl.sandbox.isolation import WorkerCgroup
from tirl.sandbox.worker import wire as proto


class WorkerDied(RuntimeError):
    """The worker failed to start, exited or did not answer in time: the pool replaces it."""


class Tier:
    """Workers sharing one preload list, with their own idle queue; `slots` are pool-wide (one uid per slot)."""

    def __init__(self, name: str, preload: tuple[str, ...], slots: range, started: bool) -> None:
        self.name = name
        self.preload = preload
        self.slots = slots
        self.started = started  # the heavy tier's workers are spawned on its first run
        self.runs = 0  # runs routed here, for stats() and tests
        self.recycles = 0  # workers replaced after a kill, a crash or max_runs_per_worker
        self.alive = 0  # started workers (idle or busy)
        # None: the pool closed, wake up and leave
        self.idle: queue.Queue[WorkerProcess | None] = queue.Queue()


class WorkerProcess:
    """One zygote process and its pipes; used by one thread at a time.

    `ready_s`: how long its start may take; `clean_s`: how long a run waits for it to wipe the previous one;
    `grace_s`: how long past a run's timeout the host waits for the reply.
    """

    def __init__(
        self,
        tier: Tier,
        slot: int,
        argv: list[str],
        cgroup: WorkerCgroup | None,
        *,
        ready_s: float,
        clean_s: float,
        grace_s: float,
    ) -> None:
        self.tier = tier
        self.slot = slot
        self.cgroup = cgroup
        self.runs = 0
        self._clean_s, self._grace_s = clean_s, grace_s
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0
        )
        self.fd_in = self.proc.stdin.fileno()
        self.fd_out = self.proc.stdout.fileno()
        self._poller = select.poll()
        self._poller.register(self.fd_out, select.POLLIN)
        self.ready = False  # the worker's ready byte read: it waits for a request
        try:
            self.ready = self._read(1, time.monotonic() + ready_s) == proto.READY
        except WorkerDied as e:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            self.proc.wait()
            err = self.proc.stderr.read(4096).decode("utf-8", "replace").strip() if self.proc.stderr else ""
            self.kill()
            raise WorkerDied(f"worker failed to start: {err or e}") from None

    def _read(self, n: int, deadline: float) -> bytes:
        parts, left = [], n
        while left:
            wait = deadline - time.monotonic()
            # poll, not select: select() fails on fd numbers >= 1024, common in a busy server or trainer
            if wait <= 0 or not self._poller.poll(wait * 1000):
                raise WorkerDied("worker did not answer in time")
            b = os.read(self.fd_out, left)
            if not b:
                raise WorkerDied(f"worker exited (code {self.proc.poll()})")
            parts.append(b)
            left -= len(b)
        return b"".join(parts)

    def wait_ready(self) -> bool:
        """Whether the worker is ready for a request: it has wiped the previous run within `clean_s`."""
        if not self.ready:
            try:
                self.ready = self._read(1, time.monotonic() + self._clean_s) == proto.READY
            except WorkerDied:
                return False
        return self.ready

    def execute(
        self, code: bytes, stdin: bytes | None, timeout: float, memory_mb: int, cpu_s: int, extra: bytes
    ) -> tuple:
        stdin_len = proto.NO_STDIN if stdin is None else len(stdin)
        head = proto.REQ.pack(len(code), stdin_len, timeout, memory_mb, cpu_s, len(extra))
        msg = head + code + (stdin or b"") + extra
        self.ready = False
        try:
            proto.write_all(self.fd_in, msg)
        except (BrokenPipeError, OSError) as e:
            raise WorkerDied(f"worker gone: {e}") from None
        deadline = time.monotonic() + timeout + self._grace_s + 1.0  # the worker drains for up to 0.5 s
        exit_code, flags, wall, n_out, n_err, n_extra = proto.RESP.unpack(
            self._read(proto.RESP.size, deadline)
        )
        n = n_out + n_err + n_extra
        body = self._read(n, deadline) if n else b""
        self.runs += 1
        return exit_code, flags, wall, body[:n_out], body[n_out : n_out + n_err], body[n_out + n_err :]

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()  # bwrap; its namespace's init (the zygote) gets SIGKILL as its parent dies
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        if self.cgroup is not None:  # kills anything left inside, then removes it
            self.cgroup.close()
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
