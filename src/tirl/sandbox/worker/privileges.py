"""What keeps a snippet from the warm worker it runs in, and from the counters of earlier runs, beyond the uid.

Standard library only: zygote.py loads this file inside the sandbox, where tirl is not importable.

- not_dumpable: the zygote's (and every runner's) /proc/1/{mem,fd,environ,...} open only for a process holding
  CAP_SYS_PTRACE over it, never for a snippet, even one that keeps the zygote's uid (tirl started without root).
  Without it such a snippet could forge the next tenant's reply through /proc/1/fd/1, read its request from
  /proc/1/fd/0, or write into the zygote's memory for later runs (its forks) to find.
- drop_capabilities: a snippet that keeps the worker's uid holds no capability either (under `unshare` without
  root the worker is root of a user namespace, whose capabilities would open /proc/1/mem despite the above).
- hide_from_snippets / reset_pids: where the zygote holds the capabilities, /proc is remounted hidepid=2 and the
  pid counter set back before each fork, so CPU counters and pids tell nothing of earlier runs.
"""

from __future__ import annotations

import ctypes
import os

_PR_SET_DUMPABLE, _PR_CAPBSET_DROP, _PR_SET_SECUREBITS = 4, 24, 28
# SECBIT_NOROOT, SECBIT_NO_SETUID_FIXUP and their locks, SECBIT_KEEP_CAPS_LOCKED: uid 0 gains no capability again
_SECUREBITS = 0b101111
_CAP_VERSION_3 = 0x20080522
_MS_REMOUNT, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 32, 2, 4, 8
_EINVAL = 22


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def not_dumpable(libc: ctypes.CDLL) -> None:
    """This process and its forks: not dumpable (inherited through fork, reset only by an exec)."""
    if libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE) failed")


def drop_capabilities(libc: ctypes.CDLL) -> None:
    """Leave this (child) process no capability, now or after an exec, in whatever user namespace it is in.

    Locking the securebits and emptying the bounding set need CAP_SETPCAP, which a worker without capabilities
    lacks and does not need; emptying the sets never fails. With no_new_privs (set with the seccomp filter) an
    exec cannot add any back.
    """
    libc.prctl(_PR_SET_SECUREBITS, _SECUREBITS, 0, 0, 0)
    for cap in range(64):
        if libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() == _EINVAL:  # past the last
            break
    if libc.capset(ctypes.byref(_CapHeader(_CAP_VERSION_3, 0)), (_CapData * 2)()) != 0:
        raise OSError(ctypes.get_errno(), "capset failed")


def hide_from_snippets(libc: ctypes.CDLL) -> int:
    """Before the seccomp filter (it denies mount), where we hold the capabilities (root, or root of our user
    namespace): /proc shows a process only to those who may ptrace it (hidepid=2), so the zygote's CPU and
    scheduler counters in /proc/1/stat, schedstat and status, which grow with every run, are out of a snippet's
    sight; returns an fd on the pid counter for reset_pids, or -1 where it is not ours to set. Without the
    capabilities both stay as they are (docs/sandbox.md says what a tenant can learn then)."""
    flags = _MS_REMOUNT | _MS_NOSUID | _MS_NODEV | _MS_NOEXEC
    libc.mount(b"proc", b"/proc", b"proc", flags, b"hidepid=2")
    try:
        fd = os.open("/proc/sys/kernel/ns_last_pid", os.O_WRONLY)
    except OSError:
        return -1
    try:
        os.pwrite(fd, b"1", 0)
    except OSError:
        os.close(fd)
        return -1
    return fd


def reset_pids(fd: int) -> None:
    """The next fork of this pid namespace gets pid 2 (the last run's processes are all reaped by now)."""
    if fd >= 0:
        try:
            os.pwrite(fd, b"1", 0)
        except OSError:
            pass
