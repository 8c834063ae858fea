"""How a warm worker is wrapped: the command line per isolation mode, and per-worker cgroups.

Cgroups: named `tirl-sandbox-<pid>-<slot>-<stamp>` after the pool's process, so that a new pool can remove those of a
process killed with -9 (remove_stale_cgroups); the v1 pids and memory hierarchies where they are writable, else the v2 unified hierarchy where this
process's cgroup delegates (or can enable) the memory and pids controllers to children, moving this process into
a leaf when its cgroup holds it alone; `cgroup_support()` says which, or why neither.

Modes, strongest first (what each does and does not cover is listed in tirl/sandbox/local.py):
  bwrap   : bubblewrap namespaces (pid, net, ipc, uts, mount); an empty read-only root holding only /usr, the
            interpreter's directories, the worker's code and a few /etc files (mounts.py), a fresh tmpfs /tmp,
            /proc, /dev, and a writable tmpfs /dev/shm.
  unshare : util-linux `unshare` namespaces (pid, net, ipc, uts, mount) with private tmpfs /tmp and /dev/shm
            (an interpreter under /tmp bound back read-only; its parent directories stay writable and are not
            wiped between runs), and /var/tmp as root; the rest of the host filesystem stays as writable as it is
            for tirl's uid. As root the snippet switches to an unprivileged uid where that uid can read the
            interpreter (unprivileged_uid_can_run), else runs as root and local.py warns loudly.
  none    : a plain process (explicit opt-in only, with a loud warning).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path

from tirl.core.config import ConfigError
from tirl.sandbox.config import SandboxConfig
from tirl.sandbox.mounts import bind_dirs, interpreter_dirs, system_mounts

ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "PYTHONIOENCODING": "utf-8",
    "PYTHONDONTWRITEBYTECODE": "1",
    # one string hash for every worker, so a snippet printing a set prints it in the same order on every run and
    # machine (with a random seed per worker, a tool output, and so an RL run, would depend on which worker ran it)
    "PYTHONHASHSEED": "0",
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}
_CGROUP_ROOT = Path("/sys/fs/cgroup")
ZYGOTE = Path(__file__).parent / "worker" / "zygote.py"  # the warm worker's entry script
_UNPRIVILEGED_UID_BASE = 2_000_000_000  # one uid per worker slot, far from real accounts


class SandboxUnavailable(ConfigError):
    """The isolation the config asks for cannot be provided here: tirl refuses to run weaker.

    A ConfigError, so every `tirl` command reports it as one line naming the problem (fix: install bubblewrap,
    or ask for a weaker `sandbox.isolation` explicitly).
    """


def snippet_uid(slot: int) -> int:
    """The uid a snippet runs as: its own per worker when we are root (so RLIMIT_NPROC binds), else ours."""
    return _UNPRIVILEGED_UID_BASE + slot if os.geteuid() == 0 else -1


def _interpreter_dirs(python: str, zygote: str) -> list[str]:
    return interpreter_dirs(python, os.path.dirname(os.path.abspath(zygote)))


def bwrap_prefix(python: str, zygote: str, tmp_bytes: int) -> list[str]:
    binary = shutil.which("bwrap")
    if binary is None:
        raise SandboxUnavailable(
            "isolation 'bwrap' requested but bwrap is not installed (apt install bubblewrap)"
        )
    # an empty root: only the system's programs and libraries, the interpreter and the worker (mounts.py)
    # /tmp 01777 like a host's: a snippet runs as its own uid and SandboxFusion clients write there
    cmd = [binary, *system_mounts(), "--perms", "01777", "--size", str(tmp_bytes), "--tmpfs", "/tmp"]
    cmd += bind_dirs(_interpreter_dirs(python, zygote))
    cmd += ["--proc", "/proc", "--dev", "/dev"]
    # a private writable /dev/shm (POSIX semaphores: multiprocessing's locks and Pool), wiped after each run
    cmd += ["--perms", "01777", "--size", str(tmp_bytes), "--tmpfs", "/dev/shm"]
    cmd += ["--remount-ro", "/"]
    cmd += ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
    cmd += ["--die-with-parent", "--new-session", "--as-pid-1", "--clearenv", "--chdir", "/tmp"]
    for k, v in ENV.items():
        cmd += ["--setenv", k, v]
    return cmd


def unprivileged_uid_can_run(python: str, zygote: str, uid: int) -> str:
    """'' when `uid` (no groups) can run `python` and read the interpreter's directories (what a snippet switched
    to it needs, e.g. to import a module), else why not. Asked of the interpreter itself, started as `uid`."""
    dirs = _interpreter_dirs(python, zygote)
    probe = "import os, sys; print(*[d for d in sys.argv[1:] if not os.access(d, os.R_OK | os.X_OK)])"
    try:
        out = subprocess.run(
            [python, "-I", "-S", "-c", probe, *dirs],
            user=uid,
            group=uid,
            extra_groups=[],
            env=ENV,
            cwd="/",
            capture_output=True,
            timeout=60,
        )
    except (OSError, subprocess.SubprocessError) as e:
        return f"uid {uid} cannot start {python} ({e})"
    bad = out.stdout.decode(errors="replace").split()
    if out.returncode != 0 or bad:
        return f"uid {uid} cannot read {', '.join(bad) or python} (an ancestor directory is not o+rx, e.g. /root)"
    return ""


def kept_tmp_entries(python: str, zygote: str) -> list[str]:
    """Names directly under /tmp that hold the interpreter or zygote.py (bound back in): the wipe skips them."""
    return sorted(
        {d[len("/tmp/") :].split("/")[0] for d in _interpreter_dirs(python, zygote) if d.startswith("/tmp/")}
    )


def unshare_prefix(python: str, zygote: str, tmp_bytes: int) -> list[str]:
    binary = shutil.which("unshare")
    if binary is None:
        raise SandboxUnavailable("isolation 'unshare' requested but util-linux unshare is not installed")
    cmd = [binary, "--pid", "--fork", "--kill-child", "--mount-proc", "--net", "--ipc", "--uts", "--mount"]
    if os.geteuid() != 0:
        cmd[1:1] = ["--user", "--map-root-user"]
    # Private tmpfs /tmp and /dev/shm in the new mount namespace (the worker wipes them after each run). An
    # interpreter or checkout under /tmp is first bound onto a staging tmpfs, then bound back read-only over
    # the fresh /tmp, so it stays importable; the staging mount is then replaced by the real /dev/shm.
    keep = [d for d in _interpreter_dirs(python, zygote) if d.startswith("/tmp/")]
    keep = [d for d in keep if not any(d.startswith(o + "/") for o in keep if o != d)]
    stage = ["mount -t tmpfs -o size=1m tirl-stage /dev/shm"]
    stage += [f"mkdir /dev/shm/{i} && mount --bind {shlex.quote(d)} /dev/shm/{i}" for i, d in enumerate(keep)]
    back = [
        f"mkdir -p {shlex.quote(d)} && mount --bind /dev/shm/{i} {shlex.quote(d)}"
        f" && mount -o remount,bind,ro {shlex.quote(d)}"
        for i, d in enumerate(keep)
    ]
    steps = stage if keep else []
    steps += [f"mount -t tmpfs -o size={tmp_bytes},mode=1777 tirl /tmp", *back]
    if os.geteuid() == 0 and os.path.isdir("/var/tmp"):  # the host's out of reach; the worker wipes this one
        steps += [f"mount -t tmpfs -o size={tmp_bytes},mode=1777 tirl /var/tmp"]
    steps += (["umount -l /dev/shm"] if keep else []) + [f"mount -t tmpfs -o size={tmp_bytes} tirl /dev/shm"]
    env = " ".join(f"{k}={v}" for k, v in ENV.items())
    return [*cmd, "/bin/sh", "-c", f'{" && ".join(steps)} && cd /tmp && exec env -i {env} "$@"', "sh"]


def none_prefix() -> list[str]:
    env = shutil.which("env") or "/usr/bin/env"
    return [env, "-i", *(f"{k}={v}" for k, v in ENV.items())]


def worker_command(config: SandboxConfig, python: str, zygote_cfg: str) -> list[str]:
    """The argv that starts one warm worker (zygote.py) inside the configured isolation."""
    tmp_bytes = max(64 * 2**20, 4 * config.max_file_bytes)
    zygote = str(ZYGOTE)
    prefix = {
        "bwrap": lambda: bwrap_prefix(python, zygote, tmp_bytes),
        "unshare": lambda: unshare_prefix(python, zygote, tmp_bytes),
        "none": none_prefix,
    }[config.isolation]()
    # -s -P rather than -I: every prefix above already clears the environment down to ENV, and -I (-E) would
    # also drop ENV's PYTHONHASHSEED
    flags = ["-s", "-P", "-B", "-X", "utf8"] + ([] if config.import_site else ["-S"])
    return [*prefix, python, *flags, zygote, zygote_cfg]


class WorkerCgroup:
    """One pids + memory cgroup per worker (two v1 directories or one v2), under this process's own cgroup;
    removed on close. `version`: "v1", "v2", or None for whichever `cgroup_support()` finds."""

    def __init__(self, name: str, *, pids_max: int, memory_bytes: int, version: str | None = None) -> None:
        self.dirs: list[Path] = []
        self.version = version or cgroup_support()[0]
        if self.version == "v1":
            plan = [
                (_own_cgroup("pids") / name, {"pids.max": pids_max}),
                (_own_cgroup("memory") / name, {"memory.limit_in_bytes": memory_bytes}),
            ]
        elif self.version == "v2":
            limits = {"pids.max": pids_max, "memory.max": memory_bytes, "memory.swap.max": 0}
            plan = [(_v2_parent() / name, limits)]
        else:
            raise OSError(f"no usable cgroup hierarchy: {cgroup_support()[1]}")
        try:
            for d, limits in plan:
                d.mkdir()
                self.dirs.append(d)
                for key, value in limits.items():
                    if key == "memory.swap.max" and not (d / key).exists():
                        continue  # a kernel without swap accounting
                    (d / key).write_text(str(value))
        except OSError:
            self.close()
            raise

    def oom_kills(self) -> int:
        """Processes the memory cgroup's OOM killer has killed (the worker is replaced after any kill)."""
        for d in self.dirs:
            for name in ("memory.oom_control", "memory.events"):  # v1, v2
                if (d / name).exists():
                    for line in (d / name).read_text().splitlines():
                        if line.startswith("oom_kill "):
                            return int(line.split()[1])
        return 0

    def enter_command(self) -> list[str]:
        """A shell prefix that moves itself into the cgroups, then execs the worker (which inherits them)."""
        script = "".join(f'echo $$ > "{d}/cgroup.procs" && ' for d in self.dirs) + 'exec "$@"'
        return ["/bin/sh", "-c", script, "sh"]

    def close(self, wait_s: float = 5.0) -> None:
        """Kill what is left inside, then remove the directories (a dying process keeps them busy a moment)."""
        deadline = time.monotonic() + wait_s
        for d in self.dirs:
            kill_and_remove_cgroup(d, deadline)
        self.dirs = []


WORKER_CGROUP_PREFIX = "tirl-sandbox-"  # + the owning process's pid + "-" + slot + "-" + a monotonic stamp


def worker_cgroup_name(slot: int) -> str:
    return f"{WORKER_CGROUP_PREFIX}{os.getpid()}-{slot}-{time.monotonic_ns()}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, someone else's
        return True
    return True


def remove_stale_cgroups(version: str, wait_s: float = 5.0) -> list[Path]:
    """Remove the worker cgroups of pools whose process is gone (killed with -9: nothing ran its cleanup), killing
    what is left inside first; returns those removed. Cgroups of live processes, ours included, are left alone."""
    if version == "v1":
        parents = [_own_cgroup("pids"), _own_cgroup("memory")]
    elif version == "v2":
        parents = [_v2_parent()]
    else:
        return []
    removed, deadline = [], time.monotonic() + wait_s
    for parent in parents:
        try:
            stale = [d for d in parent.glob(f"{WORKER_CGROUP_PREFIX}*") if d.is_dir()]
        except OSError:
            continue
        for d in stale:
            owner = d.name[len(WORKER_CGROUP_PREFIX) :].split("-")[0]
            if owner.isdigit() and not _pid_alive(int(owner)) and kill_and_remove_cgroup(d, deadline):
                removed.append(d)
    return removed


def kill_and_remove_cgroup(d: Path, deadline: float) -> bool:
    """SIGKILL every process in cgroup directory `d` until it can be removed; False if still busy at `deadline`."""
    while True:
        with contextlib.suppress(OSError, ValueError):
            for pid in (d / "cgroup.procs").read_text().split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
        try:
            d.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)


def _own_cgroup(controller: str) -> Path:
    """This process's cgroup directory for a v1 controller (the 'N:controller:/path' line)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, names, path = line.split(":", 2)
        if controller in names.split(","):
            return _CGROUP_ROOT / controller / path.lstrip("/")
    raise OSError(f"no cgroup v1 '{controller}' hierarchy in /proc/self/cgroup")


def _v2_mount(mountinfo: str | None = None) -> Path | None:
    """Where the unified (v2) hierarchy is mounted: /sys/fs/cgroup (pure v2) or /sys/fs/cgroup/unified (hybrid).

    `mountinfo`: the text of /proc/self/mountinfo (read when None).
    """
    if mountinfo is None:
        mountinfo = Path("/proc/self/mountinfo").read_text()
    for line in mountinfo.splitlines():
        fields = line.split(" - ", 1)
        if len(fields) == 2 and fields[1].split()[:1] == ["cgroup2"]:
            return Path(fields[0].split()[4])
    return None


def _own_cgroup_v2(mountinfo: str | None = None, proc_cgroup: str | None = None) -> Path:
    """This process's cgroup in the unified hierarchy (the '0::/path' line of /proc/self/cgroup, or `proc_cgroup`)."""
    mount = _v2_mount(mountinfo)
    if mount is None:
        raise OSError("no cgroup2 file system is mounted")
    if proc_cgroup is None:
        proc_cgroup = Path("/proc/self/cgroup").read_text()
    for line in proc_cgroup.splitlines():
        if line.startswith("0::"):
            return mount / line[3:].strip().lstrip("/")
    raise OSError("no cgroup v2 entry in /proc/self/cgroup")


HOST_LEAF = "tirl-host"  # where this process moves itself in a v2 cgroup it was given (see _v2_delegates)


def _v2_parent() -> Path:
    """The v2 cgroup whose children the worker cgroups are: ours, or its parent once we moved into HOST_LEAF."""
    own = _own_cgroup_v2()
    return own.parent if own.name == HOST_LEAF else own


def _v2_delegates(d: Path) -> str:
    """'' when children of `d` get the memory and pids controllers (enabling them if needed), else why not.

    cgroup v2 lets a non-root cgroup hold processes or give controllers to children, not both. So when `d` holds
    this process and nothing else (a cgroup delegated to tirl, e.g. `systemd-run --scope -p Delegate=yes`, or a
    container whose only process is tirl), we move into a leaf `d/tirl-host` first, as delegated services do.
    """
    try:
        available = (d / "cgroup.controllers").read_text().split()
        missing = [c for c in ("memory", "pids") if c not in available]
        if missing:
            return f"cgroup v2 at {d} lacks the {missing} controllers (bound to v1 hierarchies, or not delegated)"
        if not os.access(d, os.W_OK):
            return f"cgroup v2 directory {d} is not writable"
        enabled = (d / "cgroup.subtree_control").read_text().split()
        wanted = " ".join(f"+{c}" for c in ("memory", "pids") if c not in enabled)
        if not wanted:
            return ""
        try:
            (d / "cgroup.subtree_control").write_text(wanted)
        except OSError as e:
            if e.errno != errno.EBUSY:
                raise
            procs = (d / "cgroup.procs").read_text().split()
            if procs != [str(os.getpid())]:
                return (
                    f"cgroup v2 at {d} holds {len(procs)} processes besides giving controllers to children "
                    "(not allowed); run tirl in a cgroup of its own with memory and pids delegated, e.g. "
                    "`systemd-run --scope -p Delegate=yes tirl ...`"
                )
            leaf = d / HOST_LEAF
            with contextlib.suppress(FileExistsError):
                leaf.mkdir()
            (leaf / "cgroup.procs").write_text(str(os.getpid()))  # every thread of this process moves
            (d / "cgroup.subtree_control").write_text(wanted)
    except OSError as e:
        return f"cgroup v2 at {d}: cannot enable memory and pids for children ({e})"
    return ""


def cgroup_support() -> tuple[str, str]:
    """("v1" or "v2", "") for the hierarchy per-worker cgroups use here (v1 first), else ("", why neither)."""
    try:
        if all(os.access(_own_cgroup(c), os.W_OK) for c in ("pids", "memory")):
            return "v1", ""
        v1 = "the v1 pids/memory cgroups are not writable"
    except OSError as e:
        v1 = str(e)
    try:
        why = _v2_delegates(_v2_parent())
    except OSError as e:
        why = str(e)
    return ("v2", "") if not why else ("", f"{v1}; {why}")


def cgroups_writable() -> bool:
    return bool(cgroup_support()[0])
