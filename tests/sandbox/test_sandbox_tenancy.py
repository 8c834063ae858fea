"""One request never sees another's data, and nothing a request sends or a snippet does fakes an infrastructure
failure: the worker's memory holds no earlier run's code, stdin or output; fetched files are bounded; bad `files`
are refused clearly; a huge cleanup does not delay the run's own reply; stale cgroups of dead pools are removed.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import shutil
import subprocess
import sys
import textwrap
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from tirl.sandbox import LocalSandbox, SandboxConfig
from tirl.sandbox.isolation import WorkerCgroup, cgroup_support
from tirl.sandbox.local import file_request

# Counts the occurrences of each needle in this process's readable anonymous memory (heap, stack, anonymous maps),
# searched in place with libc's memmem so the scan makes no copy; the needles are built from XOR-ed hex, and the
# one buffer holding each needle is not counted. Prints one count per needle.
SCAN = textwrap.dedent(
    """
    import ctypes
    libc = ctypes.CDLL(None)
    libc.memmem.restype = ctypes.c_void_p
    libc.memmem.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t]
    needles = [bytearray(b ^ 0x55 for b in bytes.fromhex(h)) for h in HEXES]
    bufs = [(ctypes.c_char * len(n)).from_buffer(n) for n in needles]
    regions = []
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split()
            path = parts[5] if len(parts) > 5 else ""
            if parts[1][0] != "r" or not (path in ("", "[heap]", "[stack]") or path.startswith("[anon")):
                continue
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            regions.append((lo, hi))
    counts = []
    for needle, buf in zip(needles, bufs):
        own, n = ctypes.addressof(buf), 0
        for lo, hi in regions:
            at = lo
            while at < hi:
                hit = libc.memmem(at, hi - at, own, len(needle))
                if not hit:
                    break
                n += hit != own
                at = hit + 1
        counts.append(n)
    print(counts)
    """
)


def xor_hex(text: str) -> str:
    return bytes(b ^ 0x55 for b in text.encode()).hex()


@pytest.fixture(scope="module")
def single() -> Iterator[LocalSandbox]:
    """One worker in one tier: consecutive runs share it."""
    with LocalSandbox(SandboxConfig(timeout_s=10.0, max_workers=1, preload_heavy=())) as sb:
        yield sb


@pytest.mark.parametrize("with_files", [False, True], ids=["plain", "files-and-fetch"])
def test_next_run_finds_no_trace_of_the_previous_runs_data(single: LocalSandbox, with_files: bool) -> None:
    """Code, stdin, output, the names of files left in /dev/shm and the run directory, and (with `files` and
    `fetch_files`) a file's contents: none of it is in the next run's memory."""
    token = secrets.token_hex(12)
    names = ("CODE", "STDIN", "OUT", "SHM", "DIR") + (("FILE",) if with_files else ())
    marks = {n: f"{n}-{token}" for n in names}
    code = (
        f"# {marks['CODE']}\n" * 50
        + f"import sys\ndata = sys.stdin.read()\nprint('OUT-' + {token!r})\n"
        + f"open('/dev/shm/SHM-' + {token!r}, 'w').close()\nopen('DIR-' + {token!r}, 'w').close()\n"
        + ("open('out.txt', 'w').write(open('in.txt').read())\n" if with_files else "")
    )
    files = {"in.txt": base64.b64encode(marks.get("FILE", "").encode() * 50).decode()} if with_files else None
    first = single.run(
        code, stdin=marks["STDIN"] * 50, files=files, fetch_files=["out.txt"] if with_files else ()
    )
    assert first.status == "ok" and marks["OUT"] in first.stdout, first
    assert not with_files or base64.b64decode(first.files["out.txt"]).startswith(marks["FILE"].encode()), (
        first
    )
    second = single.run(f"HEXES = {[xor_hex(m) for m in marks.values()]!r}\n{SCAN}")
    assert second.status == "ok", second
    # a control: the scan finds a string this run builds itself, so a zero below is not a blind scan
    control = single.run(f"kept = 'CTL-' + {token!r}\nHEXES = {[xor_hex('CTL-' + token)]!r}\n{SCAN}")
    assert control.stdout.strip() != "[0]", control
    found = dict(zip(marks, eval(second.stdout), strict=True))
    assert not any(found.values()), f"the earlier run's data found in the next run's memory: {found}"


# Creates up to N empty files in /dev/shm, then idles until just before the run's timeout: the worker's cleanup
# is then all that stands between the run's end and the host's deadline.
SHM_FLOOD = """
import os, time
t0 = time.monotonic()
n = 0
while n < {n} and time.monotonic() - t0 < {timeout} - 1.0:
    os.close(os.open(f"/dev/shm/f{{n}}", os.O_CREAT | os.O_WRONLY))
    n += 1
print(n, flush=True)
time.sleep(max(0.0, {timeout} - 0.3 - (time.monotonic() - t0)))
"""


@pytest.mark.slow
def test_a_huge_cleanup_does_not_turn_the_run_into_a_sandbox_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import tirl.sandbox.local as local

    monkeypatch.setattr(local, "_GRACE_S", 0.0)  # the host's patience: the run's timeout (+ 1 s of drain)
    monkeypatch.setattr(
        local, "_CLEAN_S", 0.2, raising=False
    )  # then, the next run waits this long for the wipe
    timeout = 4.0
    with LocalSandbox(SandboxConfig(timeout_s=timeout, max_workers=1, preload_heavy=())) as sb:
        r = sb.run(SHM_FLOOD.format(n=300_000, timeout=timeout))
        assert r.status == "ok" and int(r.stdout) > 10_000, r
        after = sb.run("import os\nprint(len(os.listdir('/dev/shm')))")  # replaced if still wiping: empty
        assert after.status == "ok" and after.stdout == "0\n", after


def test_fetched_files_are_bounded_however_a_file_is_spelled() -> None:
    spellings = ["big", "./big", "a/../big", "big/.", ".//big", *(f"{'./' * k}big" for k in range(2, 17))]
    assert len(spellings) == 20
    cfg = SandboxConfig(max_workers=1, preload_heavy=(), max_fetch_bytes=3 * 2**20)
    with LocalSandbox(cfg) as sb:
        r = sb.run(
            "import os\nos.mkdir('a')\nopen('big', 'wb').write(os.urandom(2**20))", fetch_files=spellings
        )
        assert r.status == "ok", r
        assert len(r.files) == 3 and len(set(r.files.values())) == 1  # one content, read once
        assert sum(len(base64.b64decode(v)) for v in r.files.values()) <= 3 * 2**20
        assert set(r.files_skipped) == set(spellings) - set(r.files)
        assert all("max_fetch_bytes" in why or "exceed" in why for why in r.files_skipped.values())
        small = sb.run("open('s', 'w').write('hi')", fetch_files=["s", "big", "missing"])
        assert small.files == {"s": base64.b64encode(b"hi").decode()} and small.files_skipped == {}


def test_a_request_listing_too_many_paths_is_refused() -> None:
    with pytest.raises(ValueError, match="fetch_files lists 100000 paths"):
        file_request({}, [f"f{i}" for i in range(100_000)])
    with pytest.raises(ValueError, match="files lists 5000 paths"):
        file_request({f"f{i}": "" for i in range(5000)}, [])


def test_max_fetch_bytes_is_validated() -> None:
    with pytest.raises(ValueError, match="max_fetch_bytes"):
        SandboxConfig(max_fetch_bytes=-1)


LONG_NAME = "n" * 300
DEEP = "/".join(["d"] * 2000) + "/f"
B64 = base64.b64encode(b"x").decode()


@pytest.mark.parametrize(
    ("files", "match"),
    [
        ({"a": B64, "a/b": B64}, "'a' is a file and also the folder of 'a/b'"),
        ({"x/a": B64, "x/./a/b/c": B64}, "is a file and also the folder"),
        ({LONG_NAME: B64}, "over 255 bytes"),
        ({DEEP: B64}, "too long"),
    ],
    ids=["file-and-folder", "file-and-folder-normalized", "long-name", "deep-path"],
)
def test_files_the_worker_cannot_create_are_refused_clearly(files: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        file_request(files, [])


def test_a_fetch_path_the_worker_cannot_read_is_refused_clearly() -> None:
    with pytest.raises(ValueError, match="over 255 bytes"):
        file_request({}, [LONG_NAME])


def test_the_worker_survives_files_it_cannot_write(
    single: LocalSandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the host's checks (bypassed here), the worker reports the error as the run's own and lives on."""
    import tirl.sandbox.local as local

    monkeypatch.setattr(
        local, "file_request", lambda files, fetch: json.dumps({"files": files, "fetch": fetch}).encode()
    )
    for files in ({"a": B64, "a/b": B64}, {LONG_NAME: B64}, {DEEP: B64}):
        r = single.run("print('ran')", files=files)
        assert r.status == "runtime_error" and r.stdout == "", r
        assert "could not write the request's files" in r.stderr and r.sandbox_error is None, r
    recycles = single.stats()["light_recycles"]
    r = single.run("print('next')")
    assert r.status == "ok" and r.stdout == "next\n" and single.stats()["light_recycles"] == recycles, r


def test_fetch_limit_reaches_a_sandboxfusion_client() -> None:
    from tirl.sandbox.fusion import from_response, to_response
    from tirl.sandbox.types import ExecResult

    r = ExecResult("", "", 0, False, False, 0.1, files={"a": B64}, files_skipped={"b": "left out: ..."})
    reply = to_response(r)
    assert reply["files"] == {"a": B64} and reply["tirl"]["files_skipped"] == {"b": "left out: ..."}
    assert from_response(reply, wall_time=0.1).files_skipped == {"b": "left out: ..."}


def dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


@pytest.mark.skipif(not cgroup_support()[0], reason="needs usable cgroups")
def test_a_new_pool_removes_the_cgroups_of_a_pool_killed_with_9() -> None:
    version = cgroup_support()[0]
    stale_name = f"tirl-sandbox-{dead_pid()}-0-123"
    live_name = f"tirl-sandbox-{os.getpid()}-99-123"  # a live owner's (ours): left alone
    stale = WorkerCgroup(stale_name, pids_max=8, memory_bytes=2**28, version=version)
    live = WorkerCgroup(live_name, pids_max=8, memory_bytes=2**28, version=version)
    # a worker left running inside the stale cgroup, as after kill -9 of its pool's process
    sleeper = subprocess.Popen([*stale.enter_command(), "sleep", "60"])
    try:
        deadline = time.monotonic() + 5
        while str(sleeper.pid) not in (stale.dirs[0] / "cgroup.procs").read_text():
            assert time.monotonic() < deadline, "the sleeper never entered its cgroup"
            time.sleep(0.01)
        with LocalSandbox(SandboxConfig(max_workers=1, preload_heavy=())) as sb:
            assert sb.run("print(1)").stdout == "1\n"
            assert not any(d.exists() for d in stale.dirs), stale.dirs
            assert all(d.exists() for d in live.dirs)
        assert sleeper.wait(timeout=5) == -9
    finally:
        sleeper.kill()
        sleeper.wait()
        stale.close()
        live.close()


UNSHARE_AS_ROOT = pytest.mark.skipif(
    shutil.which("unshare") is None or os.geteuid() != 0, reason="needs util-linux unshare and root"
)
# prints the snippet's uid, and writes /var/tmp (the worker's own there, wiped after the run: not the host's)
PROBE_UID = "import os\nprint(os.getuid())\nopen('/var/tmp/tirl-probe', 'w').write('x')"
LEFT = "import os\nprint(os.path.exists('/var/tmp/tirl-probe'))"


@UNSHARE_AS_ROOT
def test_unshare_as_root_runs_snippets_as_an_unprivileged_uid() -> None:
    python = next((p for p in PUBLIC_PYTHONS if os.path.exists(p) and not uid_cannot_run(p)), None)
    if python is None:
        pytest.skip("no interpreter here that an unprivileged uid can read")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning: nothing weaker than documented
        sb = LocalSandbox(SandboxConfig(isolation="unshare", python=python, max_workers=1, preload_heavy=()))
    with sb:
        r, after = sb.run(PROBE_UID), sb.run(LEFT)
        denied = sb.run("print(open('/root/.bashrc').read()[:1])")
    assert r.status == "ok" and int(r.stdout) != 0 and after.stdout == "False\n", (r, after)
    assert denied.status == "runtime_error" and "Permission denied" in denied.stderr, denied
    assert not os.path.exists("/var/tmp/tirl-probe")


@UNSHARE_AS_ROOT
def test_unshare_as_root_with_an_unreadable_interpreter_warns_loudly(tmp_path: Path) -> None:
    python = sys.executable
    why = uid_cannot_run(python)
    if not why:
        pytest.skip(f"an unprivileged uid can read {python}: the uid switch applies (tested above)")
    with pytest.warns(RuntimeWarning, match="AS ROOT"):
        sb = LocalSandbox(SandboxConfig(isolation="unshare", max_workers=1, preload_heavy=()))
    with sb:
        r, after = sb.run(PROBE_UID), sb.run(LEFT)
    assert r.status == "ok" and r.stdout == "0\n" and after.stdout == "False\n", (r, after)
    assert not os.path.exists("/var/tmp/tirl-probe")  # the host's /var/tmp was never the snippet's


PUBLIC_PYTHONS = ("/usr/bin/python3", "/usr/local/bin/python3")


def uid_cannot_run(python: str) -> str:
    from tirl.sandbox.isolation import ZYGOTE, snippet_uid, unprivileged_uid_can_run

    return unprivileged_uid_can_run(python, str(ZYGOTE), snippet_uid(0))


def test_the_worker_ends_cleanly_when_the_host_closes_its_pipe() -> None:
    """EOF on the worker's fd 0, between requests, ends it with status 0 (its runner exits, then the zygote)."""
    with LocalSandbox(SandboxConfig(max_workers=1, preload_heavy=())) as sb:
        assert sb.run("print(1)").stdout == "1\n"
        worker = sb._light.idle.get()
        try:
            assert worker.wait_ready()
            worker.proc.stdin.close()
            assert worker.proc.wait(timeout=10) == 0
        finally:
            sb._retire(worker)


# Run A makes a System V shared-memory segment and a POSIX message queue, each holding a token; run B looks for them.
IPC_MAKE = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
made = []
shm = libc.shmget(0x7172, 4096, 0o1666)
if shm >= 0:
    ctypes.memmove(libc.shmat(shm, None, 0), TOKEN, len(TOKEN))
    made.append("shm")
mq = libc.mq_open(b"/tirl-probe", os.O_CREAT | os.O_RDWR, 0o666, None)
if mq >= 0:
    libc.mq_send(mq, TOKEN, len(TOKEN), 0)
    made.append("mq")
print(made, ctypes.get_errno())
"""
IPC_FIND = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
found = []
if libc.shmget(0x7172, 0, 0) >= 0:
    found.append("shm")
if libc.mq_open(b"/tirl-probe", os.O_RDONLY, 0, None) >= 0:
    found.append("mq")
print(found)
"""


def test_ipc_objects_of_one_run_are_not_there_for_the_next(single: LocalSandbox) -> None:
    """SysV shared memory and POSIX message queues outlive the process that made them: a snippet cannot make them,
    so the next tenant of the worker finds none (POSIX shared memory and semaphores live in the wiped /dev/shm)."""
    token = secrets.token_hex(8)
    made = single.run(f"TOKEN = {token.encode()!r}\n" + IPC_MAKE)
    assert made.status == "ok", made
    assert single.run(IPC_FIND).stdout == "[]\n", made.stdout


def test_sysv_shared_memory_cannot_hold_memory_beyond_the_runs_limit() -> None:
    """Without cgroups (what `auto` falls back to where they are not writable) a run with memory_mb=128 that parks
    400 MB in detached SysV segments, each attached and filled in turn within its address-space limit, leaves the
    host's shared memory as it was, during the run and after it."""
    code = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
made = 0
for key in range(4):
    shm = libc.shmget(0x5000 + key, 100 << 20, 0o1600)
    if shm < 0:
        break
    at = libc.shmat(shm, None, 0)
    ctypes.memset(at, 1, 100 << 20)
    libc.shmdt(ctypes.c_void_p(at))
    made += 1
print(made, open("/proc/meminfo").read().split("Shmem:")[1].split()[0])
"""

    def host_shmem_kb() -> int:
        return int(Path("/proc/meminfo").read_text().split("Shmem:")[1].split()[0])

    with LocalSandbox(SandboxConfig(max_workers=1, preload_heavy=(), cgroups="off", memory_mb=128)) as sb:
        before = host_shmem_kb()
        r = sb.run(code, timeout_s=30)
        after = host_shmem_kb()
    assert r.status == "ok" and r.stdout.split()[0] == "0", r
    assert int(r.stdout.split()[1]) - before < 100 * 1024 and after - before < 100 * 1024, (
        before,
        r.stdout,
        after,
    )


def test_a_run_learns_nothing_of_earlier_runs_from_pids_or_timestamps(single: LocalSandbox) -> None:
    """The pid a run gets and the modification time of the worker's /dev/shm are the same whatever earlier
    runs did (20 processes, a file in /dev/shm); tirl started as root also hides the worker's /proc entries (its
    CPU and scheduler counters grow with every run) from the snippet, another uid."""
    probe = "import os\nprint(os.getpid(), os.stat('/dev/shm').st_mtime_ns, os.path.exists('/proc/1/stat'))"
    first = single.run(probe).stdout.split()
    busy = single.run(
        "import subprocess\nfor _ in range(20): subprocess.run(['true'])\nopen('/dev/shm/x', 'w')"
    )
    assert busy.status == "ok", busy
    second = single.run(probe).stdout.split()
    assert first[:2] == second[:2], (first, second)
    if os.geteuid() == 0:
        assert first[2] == second[2] == "False", (first, second)
