"""Per-worker cgroups: the v1 path against the real kernel where its hierarchies are writable (memory and pids
caps enforced, OOM kills counted, directories removed), and the v2 (unified) path for real where the machine
delegates memory and pids, else against an emulated cgroup2 file system.

The emulation (FakeCgroup2) keeps the kernel's rules that the code depends on: a child directory gets the
interface files of the controllers its parent enables in `cgroup.subtree_control` and no others, no file can be
created, `+ctrl` needs the controller in `cgroup.controllers` and a parent without processes of its own (EBUSY),
limits are validated, `cgroup.subtree_control` reads back canonically, and rmdir fails (EBUSY) while a live
process is listed in `cgroup.procs`. Nothing is enforced there: those tests check what tirl writes, reads and
removes, and that the pool runs on it; enforcement is checked on the real hierarchy.

Real-kernel tests run each hostile child under `timeout -s KILL` inside the cgroup under test, whose caps are
small, so a containment failure cannot take the machine down.
"""

from __future__ import annotations

import errno
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tirl.sandbox import LocalSandbox, SandboxConfig
from tirl.sandbox import isolation as iso
from tirl.sandbox.isolation import WorkerCgroup, cgroup_support

# -- parsing /proc/self/mountinfo and /proc/self/cgroup --------------------------------------------------------

HYBRID_MOUNTINFO = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
PURE_V2_MOUNTINFO = """\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
35 24 0:30 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate
"""


def test_v2_mount_and_own_cgroup_are_parsed_for_hybrid_and_pure_v2_hosts() -> None:
    assert iso._v2_mount(HYBRID_MOUNTINFO) == Path("/sys/fs/cgroup/unified")
    assert iso._v2_mount(PURE_V2_MOUNTINFO) == Path("/sys/fs/cgroup")
    assert iso._v2_mount("22 1 8:1 / / rw - ext4 /dev/sda1 rw\n") is None
    own = iso._own_cgroup_v2(PURE_V2_MOUNTINFO, "0::/user.slice/user-0.slice/session-3.scope\n")
    assert own == Path("/sys/fs/cgroup/user.slice/user-0.slice/session-3.scope")
    assert iso._own_cgroup_v2(HYBRID_MOUNTINFO, "4:memory:/a\n0::/\n") == Path("/sys/fs/cgroup/unified")
    with pytest.raises(OSError, match="no cgroup2"):
        iso._own_cgroup_v2("22 1 8:1 / / rw - ext4 /dev/sda1 rw\n", "0::/\n")
    with pytest.raises(OSError, match="no cgroup v2 entry"):
        iso._own_cgroup_v2(PURE_V2_MOUNTINFO, "4:memory:/a\n")


# -- the v2 path against an emulated cgroup2 file system ----------------------------------------------------------

_CONTROLLER_FILES = {
    "memory": {
        "memory.max": "max",
        "memory.swap.max": "max",
        "memory.current": "0",
        "memory.events": "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n",
    },
    "pids": {"pids.max": "max", "pids.current": "0", "pids.events": "max 0\n"},
    "cpu": {"cpu.max": "max 100000", "cpu.weight": "100"},
}
_CORE_FILES = {"cgroup.procs": "", "cgroup.subtree_control": "", "cgroup.events": "populated 0\nfrozen 0\n"}


class FakeCgroup2:
    """A directory tree that answers mkdir, rmdir and writes the way cgroup2 does (see the module docstring)."""

    def __init__(self, root: Path, controllers: tuple[str, ...], procs: str = "") -> None:
        self.root = root
        root.mkdir()
        for name, text in _CORE_FILES.items():
            (root / name).write_bytes(text.encode())
        (root / "cgroup.controllers").write_bytes(" ".join(controllers).encode())
        (root / "cgroup.procs").write_bytes(procs.encode())
        self.created: dict[Path, set[str]] = {}  # each emulated mkdir: the interface files the kernel made

    def owns(self, path: Path) -> bool:
        return path == self.root or self.root in path.parents

    def mkdir(self, d: Path) -> None:
        if d.exists():
            raise FileExistsError(errno.EEXIST, "File exists", str(d))
        parent_enabled = (d.parent / "cgroup.subtree_control").read_text().split()
        os.mkdir(d)
        files = dict(_CORE_FILES)
        files["cgroup.controllers"] = " ".join(parent_enabled)
        for c in parent_enabled:
            files.update(_CONTROLLER_FILES.get(c, {}))
        for name, text in files.items():
            (d / name).write_bytes(text.encode())  # as the kernel does, not through write()'s checks
        self.created[d] = set(files)

    def write(self, f: Path, data: str) -> None:
        if not f.exists():  # cgroupfs has a fixed set of files per directory
            raise PermissionError(errno.EACCES, "Permission denied", str(f))
        if f.name == "cgroup.subtree_control":
            available = (f.parent / "cgroup.controllers").read_text().split()
            enabled = f.read_text().split()
            for token in data.split():
                op, c = token[0], token[1:]
                if op not in "+-" or c not in available:
                    raise OSError(errno.ENOENT, f"no controller {c!r} to enable", str(f))
                if op == "+" and f.parent != self.root and (f.parent / "cgroup.procs").read_text().split():
                    raise OSError(errno.EBUSY, "no internal processes", str(f))
                enabled = [x for x in enabled if x != c] + ([c] if op == "+" else [])
            f.write_bytes(" ".join(sorted(enabled)).encode())
            return
        if f.name == "cgroup.procs":  # moves the process: out of every other cgroup, into this one
            pid = data.strip()
            enabled = set((f.parent / "cgroup.subtree_control").read_text().split())
            if f.parent != self.root and enabled & {"memory", "pids", "cpu", "io"}:
                raise OSError(errno.EBUSY, "no internal processes", str(f))
            for procs in self.root.rglob("cgroup.procs"):
                procs.write_bytes("".join(f"{p}\n" for p in procs.read_text().split() if p != pid).encode())
            f.write_bytes(f"{f.read_text()}{pid}\n".encode())
            return
        if f.name in ("pids.max", "memory.max", "memory.swap.max"):
            value = data.strip()
            if value != "max" and not (value.isdigit() and (int(value) > 0 or f.name == "memory.swap.max")):
                raise OSError(errno.EINVAL, f"invalid value {data!r}", str(f))
        elif f.name != "memory.events":
            raise PermissionError(errno.EACCES, "read-only interface file", str(f))
        f.write_bytes(data.encode())

    def own(self) -> Path:
        """This process's cgroup: the one whose cgroup.procs lists it (what /proc/self/cgroup would say)."""
        for procs in self.root.rglob("cgroup.procs"):
            if str(os.getpid()) in procs.read_text().split():
                return procs.parent
        return self.root

    def rmdir(self, d: Path) -> None:
        if any(p.is_dir() for p in d.iterdir()):
            raise OSError(errno.EBUSY, "Device or resource busy", str(d))
        for pid in (d / "cgroup.procs").read_text().split():
            if _alive(int(pid)):
                raise OSError(errno.EBUSY, "Device or resource busy", str(d))
        shutil.rmtree(d)


def _alive(pid: int) -> bool:
    """A live, non-zombie process with this pid."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture
def fake_v2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """An emulated cgroup2 hierarchy as this process's own v2 cgroup; no v1 hierarchy."""

    def make(controllers: tuple[str, ...] = ("cpu", "memory", "pids"), procs: str = "") -> FakeCgroup2:
        fake = FakeCgroup2(tmp_path / "cgroup2", controllers, procs)
        real_mkdir, real_rmdir, real_write = pathlib.Path.mkdir, pathlib.Path.rmdir, pathlib.Path.write_text

        def mkdir(self: Path, *args: object, **kwargs: object) -> None:
            return fake.mkdir(self) if fake.owns(self.parent) else real_mkdir(self, *args, **kwargs)

        def rmdir(self: Path) -> None:
            return fake.rmdir(self) if fake.owns(self) and self != fake.root else real_rmdir(self)

        def write_text(self: Path, data: str, *args: object, **kwargs: object) -> int:
            if fake.owns(self.parent):
                fake.write(self, data)
                return len(data)
            return real_write(self, data, *args, **kwargs)

        monkeypatch.setattr(pathlib.Path, "mkdir", mkdir)
        monkeypatch.setattr(pathlib.Path, "rmdir", rmdir)
        monkeypatch.setattr(pathlib.Path, "write_text", write_text)

        def no_v1(controller: str) -> Path:
            raise OSError(f"no cgroup v1 '{controller}' hierarchy (emulated v2-only host)")

        monkeypatch.setattr(iso, "_own_cgroup", no_v1)
        monkeypatch.setattr(iso, "_own_cgroup_v2", fake.own)
        return fake

    return make


def test_v2_support_enables_memory_and_pids_for_children(fake_v2) -> None:
    fake = fake_v2()
    assert cgroup_support() == ("v2", "")
    assert (fake.root / "cgroup.subtree_control").read_text().split() == ["memory", "pids"]
    assert cgroup_support() == ("v2", "")  # already enabled: nothing to write, same answer


def test_v2_support_explains_missing_controllers(fake_v2) -> None:
    """A hybrid host's unified hierarchy (as on this project's CI box) has no memory/pids: no cgroups, and why."""
    fake_v2(controllers=("hugetlb",))
    version, why = cgroup_support()
    assert version == "" and "lacks the ['memory', 'pids'] controllers" in why and "v1" in why


def _service_cgroup(fake: FakeCgroup2, *pids: int) -> Path:
    """A non-root cgroup with memory and pids available, holding `pids` (as systemd gives a service or scope)."""
    (fake.root / "cgroup.subtree_control").write_text("+memory +pids")
    service = fake.root / "service"
    service.mkdir()
    for pid in pids:
        (service / "cgroup.procs").write_text(str(pid))
    return service


def test_v2_in_a_cgroup_of_its_own_moves_into_a_leaf_and_delegates(fake_v2) -> None:
    """A delegated cgroup holding only tirl (systemd-run --scope -p Delegate=yes, a one-process container): tirl
    moves itself into tirl-host, enables memory and pids, and worker cgroups go next to it."""
    fake = fake_v2()
    service = _service_cgroup(fake, os.getpid())
    assert cgroup_support() == ("v2", "")
    assert (service / "tirl-host" / "cgroup.procs").read_text().split() == [str(os.getpid())]
    assert (service / "cgroup.procs").read_text().split() == []
    assert (service / "cgroup.subtree_control").read_text().split() == ["memory", "pids"]
    assert cgroup_support() == ("v2", "")  # again, from inside tirl-host: nothing moves, nothing nests
    assert sorted(p.name for p in service.iterdir() if p.is_dir()) == ["tirl-host"]
    cg = WorkerCgroup("w0", pids_max=8, memory_bytes=2**30, version="v2")
    assert cg.dirs == [service / "w0"] and (service / "w0" / "pids.max").read_text() == "8"
    cg.close()
    assert not (service / "w0").exists()


def test_v2_support_explains_a_cgroup_shared_with_other_processes(fake_v2) -> None:
    """tirl's cgroup also holds another process (a login shell's session scope): no cgroups, and what to do."""
    fake = fake_v2()
    service = _service_cgroup(fake, os.getppid(), os.getpid())
    version, why = cgroup_support()
    assert version == "" and "holds 2 processes" in why and "Delegate=yes" in why
    assert not (service / "tirl-host").exists()  # nothing moved


def test_v2_worker_cgroup_writes_limits_enters_counts_ooms_and_cleans_up(fake_v2) -> None:
    fake = fake_v2()
    assert cgroup_support()[0] == "v2"
    cg = WorkerCgroup("w0", pids_max=72, memory_bytes=1536 * 2**20, version="v2")
    (d,) = cg.dirs
    assert d == fake.root / "w0"
    assert (d / "pids.max").read_text() == "72"
    assert (d / "memory.max").read_text() == str(1536 * 2**20)
    assert (d / "memory.swap.max").read_text() == "0"  # no swapping around the memory limit
    assert {p.name for p in d.iterdir()} == fake.created[d]  # wrote only files the kernel would have
    # the worker's shell moves itself in before exec'ing the worker, which then inherits the cgroup
    proc = subprocess.Popen([*cg.enter_command(), "sleep", "30"])
    try:
        deadline = time.monotonic() + 10
        while not (d / "cgroup.procs").read_text().strip() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert (d / "cgroup.procs").read_text().split() == [str(proc.pid)]
        assert cg.oom_kills() == 0
        (d / "memory.events").write_text(
            "low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n"
        )  # what the kernel reports
        assert cg.oom_kills() == 1
        # close() kills what is still inside (the sleep) and removes the directory once it is empty
        cg.close(wait_s=10)
        assert proc.wait(timeout=10) == -signal.SIGKILL
        assert not d.exists() and cg.dirs == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_v2_worker_cgroup_is_removed_when_a_limit_cannot_be_set(fake_v2) -> None:
    """No controllers enabled for children: memory.max does not exist, the constructor fails and leaves nothing."""
    fake = fake_v2()
    with pytest.raises(PermissionError):
        WorkerCgroup("w1", pids_max=8, memory_bytes=2**30, version="v2")
    assert not (fake.root / "w1").exists()


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
def test_pool_on_v2_cgroups_reports_oom_kills_and_removes_its_cgroups(fake_v2) -> None:
    """The pool with `cgroups: required` on a v2-only host: one cgroup per worker with its limits, the worker
    inside, a SIGKILLed run counted as memory_exceeded only when memory.events says the OOM killer did it."""
    fake = fake_v2()
    cfg = SandboxConfig(cgroups="required", max_workers=1, preload_heavy=(), memory_mb=256, max_processes=16)
    with LocalSandbox(cfg) as sb:
        assert sb.cgroup_version == "v2"
        (worker,) = list(sb._all)
        (d,) = worker.cgroup.dirs
        assert d.parent == fake.root
        assert (d / "pids.max").read_text() == "24" and (d / "memory.max").read_text() == str(768 * 2**20)
        assert (d / "cgroup.procs").read_text().split() == [str(worker.proc.pid)]
        assert sb.run("print(6 * 7)").stdout == "42\n"
        suicide = "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)"
        plain = sb.run(suicide)  # SIGKILL, but not the OOM killer: not a memory error
        assert plain.exit_code == -signal.SIGKILL and not plain.memory_exceeded
        deadline = time.monotonic() + 60  # the killed run's worker is replaced, with a fresh cgroup
        while sb.stats()["light_idle"] < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        (worker,) = list(sb._all)
        (d2,) = worker.cgroup.dirs
        assert d2 != d and not d.exists()
        (d2 / "memory.events").write_text("oom 1\noom_kill 1\n")
        oom = sb.run(suicide)
        assert oom.memory_exceeded and oom.status == "memory_exceeded"
    assert [p for p in fake.root.iterdir() if p.is_dir()] == []  # every worker cgroup removed on close


# -- the real kernel: v1 here, v2 where the machine delegates it ---------------------------------------------------

_HOSTILE_PIDS = """
import os, time
n = 0
for _ in range(40):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        os.close(1)  # the parent's reader must not wait for us
        os.close(2)
        time.sleep(20)
        os._exit(0)
    n += 1
print(n, flush=True)
"""
_HOSTILE_MEMORY = """
import time
chunks = []
for i in range(40):  # up to 400 MiB, each page touched
    b = bytearray(10 * 2**20)
    b[::4096] = b"x" * len(b[::4096])
    chunks.append(b)
    print(i, flush=True)
print("survived", flush=True)
"""


def _real_versions() -> list:
    version, why = cgroup_support()
    if version == "v1":
        return ["v1"]  # (v2 then has no memory/pids here: both controllers are bound to v1)
    if version == "v2":
        return ["v2"]
    return [pytest.param("none", marks=pytest.mark.skip(reason=f"no writable cgroups here: {why}"))]


def _run_inside(cg: WorkerCgroup, code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*cg.enter_command(), "timeout", "-s", "KILL", "60", sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )


@pytest.mark.parametrize("version", _real_versions())
def test_real_cgroup_caps_processes(version: str) -> None:
    """pids.max = 6: the shell exec's into `timeout`, which runs python: 2 tasks, so 4 forks succeed."""
    cg = WorkerCgroup(f"tirl-test-pids-{os.getpid()}", pids_max=6, memory_bytes=256 * 2**20, version=version)
    try:
        r = _run_inside(cg, _HOSTILE_PIDS)
        assert r.stdout.strip() == "4", r
    finally:
        cg.close(wait_s=10)
    assert all(not d.exists() for d in cg.dirs)


@pytest.mark.parametrize("version", _real_versions())
def test_real_cgroup_caps_memory_and_counts_the_oom_kill(version: str) -> None:
    """A 64 MiB cap: the process touching 400 MiB is OOM-killed early; oom_kills() sees it; the cgroup goes."""
    cg = WorkerCgroup(f"tirl-test-mem-{os.getpid()}", pids_max=16, memory_bytes=64 * 2**20, version=version)
    dirs = list(cg.dirs)
    try:
        r = _run_inside(cg, _HOSTILE_MEMORY)
        assert r.returncode in (-signal.SIGKILL, 128 + signal.SIGKILL) and "survived" not in r.stdout, r
        assert len(r.stdout.split()) < 8  # killed near 64 MiB, not at the 60 s outer timeout
        assert cg.oom_kills() >= 1
    finally:
        cg.close(wait_s=10)
    assert dirs and all(not d.exists() for d in dirs)
