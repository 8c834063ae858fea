"""The syscall filter every snippet runs under: compiled once on the host by libseccomp (pyseccomp), loaded by each
warm zygote after its imports (zygote.py) and so inherited by every snippet it forks, at no cost per run.

Default allow; the calls below fail with EPERM (clone3 with ENOSYS, so glibc falls back to clone, whose flags a
filter can inspect). A syscall from another ABI (i386, x32) kills the process: libseccomp's bad-arch action.
"""

from __future__ import annotations

import errno
import os
import tempfile

from tirl.sandbox.isolation import SandboxUnavailable

DENIED = (
    # debugging and reading other processes
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp",
    # file systems, namespaces, root changes
    "mount", "umount2", "pivot_root", "chroot", "unshare", "setns", "open_by_handle_at", "name_to_handle_at",
    "fsopen", "fsmount", "fsconfig", "move_mount", "open_tree", "fspick", "mount_setattr",
    # the kernel itself
    "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module", "reboot", "swapon",
    "swapoff", "acct", "iopl", "ioperm", "syslog", "bpf", "perf_event_open", "userfaultfd", "lookup_dcookie",
    "quotactl", "vhangup", "settimeofday", "clock_settime", "clock_adjtime", "adjtimex",
    "io_uring_setup", "io_uring_enter", "io_uring_register", "fanotify_init",
    # the kernel keyring
    "keyctl", "add_key", "request_key",
    # System V IPC and POSIX message queues: objects that outlive the run that made them (the next tenant of the
    # worker could read them) and hold memory outside its limits (a SysV segment is counted by no rlimit once
    # detached); POSIX shared memory and semaphores live in the worker's /dev/shm, which is bounded and wiped
    "shmget", "shmat", "msgget", "semget", "mq_open",
)  # fmt: skip
CLONE_NAMESPACE_FLAGS = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000)
AF_PACKET, SOCK_RAW, SOCK_TYPE_MASK = 17, 3, 0xF


def compile_filter() -> bytes:
    """The BPF program (struct sock_filter[]) for this machine's architecture; SandboxUnavailable without libseccomp."""
    try:
        import pyseccomp as sc
    except (ImportError, RuntimeError) as e:  # RuntimeError: the bindings found no libseccomp.so
        raise SandboxUnavailable(
            f"sandbox.seccomp needs libseccomp and its Python bindings (pip install pyseccomp; apt install "
            f"libseccomp2), or sandbox.seccomp=false: {e}"
        ) from None
    f = sc.SyscallFilter(sc.ALLOW)
    deny = sc.ERRNO(errno.EPERM)
    for name in DENIED:
        try:
            f.add_rule(deny, name)
        except (OSError, ValueError):  # a syscall this architecture or libseccomp version does not know
            continue
    for flag in CLONE_NAMESPACE_FLAGS:  # new namespaces (a user namespace above all): clone's flags are arg 0
        f.add_rule(deny, "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
    f.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")  # its flags live in memory a filter cannot read
    f.add_rule(deny, "socket", sc.Arg(0, sc.EQ, AF_PACKET))
    f.add_rule(deny, "socket", sc.Arg(1, sc.MASKED_EQ, SOCK_TYPE_MASK, SOCK_RAW))
    with tempfile.TemporaryFile() as tmp:
        f.export_bpf(tmp)
        tmp.flush()
        os.lseek(tmp.fileno(), 0, os.SEEK_SET)
        return os.read(tmp.fileno(), 1 << 20)
