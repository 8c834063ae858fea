"""The zygote's side of one run while it runs: the snippet's stdout and stderr read into preallocated buffers up to
the cap, and every process of the run killed when its main process exits, times out or floods its output, then
reaped.

Standard library only: zygote.py loads this file inside the sandbox, where tirl is not importable.

In a pid namespace (the zygote is its init) kill(-1) reaches every process of the worker but the caller and the
namespace init, the zygote; a runner is a child subreaper, so orphans are its to reap: daemons and setsid() escapes
die with the run. Without a namespace (isolation none) only the run's session can be killed. A process that still
holds a pipe once everything is killed gets `DRAIN_S` to let go of it.
"""

from __future__ import annotations

import os
import select
import signal
import time

if __package__:  # imported on the host (tests, tools)
    from tirl.sandbox.worker import wire
else:  # loaded by path by zygote.py inside the sandbox (the same module, never tirl's)
    import wire

CHUNK = 65536  # bytes read from a pipe at once, and the scratch buffer a flood is drained into
DRAIN_S = 0.5


def collect(
    views: list[memoryview],
    cap: int,
    pidns: bool,
    pid: int,
    pidfd: int,
    out_r: int,
    err_r: int,
    deadline: float,
) -> tuple[int, int, int]:
    """Read both pipes into `views` (stdout's, stderr's, the scratch buffer) up to `cap` until they close and the
    main process has exited (a snippet that closes its stdout still runs until it exits or times out); kill
    everything on timeout or overflow. Returns the two streams' lengths and the flags."""
    streams = {out_r: views[0], err_r: views[1]}
    lens = {out_r: 0, err_r: 0}
    flags = 0
    drain_until = 0.0  # set once everything is killed: the pipes must close within DRAIN_S
    poller = select.poll()
    for fd in (out_r, err_r, pidfd):
        poller.register(fd, select.POLLIN)
    open_fds, exited = 2, False
    while open_fds or not exited:
        now = time.monotonic()
        if not drain_until and now >= deadline:
            flags |= wire.F_TIMEOUT
            drain_until = kill_all(pidns, now, pid)
        if drain_until and now >= drain_until:
            break  # a process we cannot see still holds a pipe: give up on it
        for fd, _ev in poller.poll(max(0.0, (drain_until or deadline) - now) * 1000):
            if fd == pidfd:
                poller.unregister(pidfd)
                exited = True
                if not drain_until:
                    drain_until = kill_all(pidns, time.monotonic(), pid)  # main exited: no stragglers
                continue
            pos = lens[fd]
            # up to one byte past the cap (that byte says the stream overflowed), then into the scratch buffer
            into = streams[fd][pos : min(cap + 1, pos + CHUNK)] if pos <= cap else views[2]
            n = os.readv(fd, [into])
            if not n:
                poller.unregister(fd)
                open_fds -= 1
                continue
            lens[fd] = min(pos + n, cap + 1)
            if lens[fd] > cap and not flags & wire.F_TRUNCATED:
                flags |= wire.F_TRUNCATED
                if not drain_until:
                    drain_until = kill_all(pidns, time.monotonic(), pid)
    return min(lens[out_r], cap), min(lens[err_r], cap), flags


def kill_all(pidns: bool, now: float, pid: int) -> float:
    """SIGKILL every process of the run; returns the time by which the pipes must have closed."""
    try:
        if pidns:
            os.kill(-1, signal.SIGKILL)  # every process of our pid namespace but us (its init)
        else:
            os.killpg(pid, signal.SIGKILL)  # no namespace: only the run's session
    except (ProcessLookupError, PermissionError):
        pass
    return now + DRAIN_S


def reap(pidns: bool) -> None:
    """Wait for every process the run left (we are their init); re-kill any forked during the kill."""
    deadline = time.monotonic() + 2.0
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid:
            continue
        if not pidns or time.monotonic() > deadline:
            return  # without a namespace, the host-side group kill is all we can do
        kill_all(pidns, 0.0, 0)
        time.sleep(0.001)
