"""LocalSandbox (the in-process warm pool): each test checks one property the module docstring promises.

Snippets here stay bounded even if containment fails: the memory bomb asks for 4 GiB against a 256 MiB limit
(the machine has more), the output flood and the infinite loop end at the wall-clock timeout, and background
children only sleep. The fork bomb and the other hostile snippets run in tests/sandbox/test_sandbox_hostile.py,
against a server inside an outer cgroup.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tirl.sandbox import ExecResult, LocalSandbox, SandboxConfig, SandboxUnavailable

EXPECTED_ENV = {
    "PATH",
    "HOME",
    "TMPDIR",
    "LANG",
    "PYTHONIOENCODING",
    "PYTHONDONTWRITEBYTECODE",
    "PYTHONHASHSEED",
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
}


@pytest.fixture(scope="module")
def sandbox() -> Iterator[LocalSandbox]:
    with LocalSandbox(SandboxConfig(timeout_s=3.0)) as sb:
        yield sb


@pytest.fixture(scope="module")
def single() -> Iterator[LocalSandbox]:
    """One worker, so that consecutive runs are known to share it."""
    with LocalSandbox(SandboxConfig(timeout_s=3.0, max_workers=1)) as sb:
        yield sb


# What a snippet sees of its worker's pid namespace besides itself when nothing else is left: the worker (pid 1);
# nothing when tirl runs as root, where /proc hides the worker (another uid) from the snippet
ONLY_THE_WORKER = "[]\n" if os.geteuid() == 0 else "[1]\n"


def other_pids(sb: LocalSandbox) -> str:
    """Processes in the worker's pid namespace besides the run itself: only its init (the worker) should remain."""
    code = "import os\nprint(sorted(int(p) for p in os.listdir('/proc') if p.isdigit() and p != str(os.getpid())))"
    return sb.run(code).stdout


def is_dead(pid: int) -> bool:
    """Gone, or a zombie: this container's PID 1 may not reap orphans, and a zombie runs no code."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def wait_dead(pid: int, within_s: float = 2.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if is_dead(pid):
            return True
        time.sleep(0.05)
    return is_dead(pid)


def test_print(sandbox: LocalSandbox) -> None:
    r = sandbox.run("print('hello', 6 * 7)")
    assert (r.status, r.stdout, r.stderr, r.exit_code) == ("ok", "hello 42\n", "", 0)
    assert not r.timed_out and not r.output_truncated and r.sandbox_error is None


def test_stdin_is_passed(sandbox: LocalSandbox) -> None:
    assert sandbox.run("print(input()[::-1])", stdin="abc\n").stdout == "cba\n"
    r = sandbox.run("input()")  # /dev/null: EOF, not a hang
    assert r.status == "runtime_error" and "EOFError" in r.stderr


def test_run_batch_passes_one_stdin_per_snippet(sandbox: LocalSandbox) -> None:
    code = "print(input()[::-1])"
    results = sandbox.run_batch([code, code, "print('none')"], stdins=["abc", "xyz", None])
    assert [r.stdout for r in results] == ["cba\n", "zyx\n", "none\n"]
    with pytest.raises(ValueError, match="2 snippets but 1 stdins"):
        sandbox.run_batch([code, code], stdins=["a"])


def test_exception_gives_traceback_and_exit_code_1(sandbox: LocalSandbox) -> None:
    r = sandbox.run("x = 1\ny = x / 0\n")
    assert r.status == "runtime_error"
    assert r.exit_code == 1
    assert 'File "snippet.py", line 2' in r.stderr
    assert "y = x / 0" in r.stderr  # the source line is shown
    assert r.stderr.rstrip().endswith("ZeroDivisionError: division by zero")
    assert "tirl-sbx-" not in r.stderr  # no temporary path leaks into what the model sees


def test_infinite_loop_times_out(sandbox: LocalSandbox) -> None:
    t0 = time.monotonic()
    r = sandbox.run("print('started', flush=True)\nwhile True:\n    pass\n", timeout_s=1.0)
    elapsed = time.monotonic() - t0
    assert r.status == "timeout" and r.timed_out
    assert r.exit_code == -9
    assert 1.0 <= elapsed < 2.0
    assert r.stdout == "started\n"  # output before the timeout is kept


def test_cpu_time_limit_ends_a_busy_loop() -> None:
    # The wall clock is generous so that, on a loaded machine, 1 s of CPU time still comes first.
    with LocalSandbox(SandboxConfig(timeout_s=10.0, cpu_time_s=1)) as sb:
        r = sb.run("while True:\n    pass\n")
    assert r.status == "timeout" and not r.timed_out  # SIGXCPU from RLIMIT_CPU, not the wall clock
    assert r.exit_code == -24


def test_memory_bomb_fails_under_rlimit() -> None:
    with LocalSandbox(SandboxConfig(timeout_s=3.0, memory_mb=256)) as sb:
        r = sb.run("x = bytearray(4 * 2**30)\nprint('allocated')\n")
    assert r.status == "memory_exceeded"
    assert "MemoryError" in r.stderr and "allocated" not in r.stdout


def test_huge_output_is_truncated(sandbox: LocalSandbox) -> None:
    cap = 10_000
    with LocalSandbox(SandboxConfig(timeout_s=3.0, max_output_bytes=cap)) as sb:
        t0 = time.monotonic()
        r = sb.run("import sys\nwhile True:\n    sys.stdout.write('x' * 4096)\n")
    assert r.status == "output_truncated" and r.output_truncated and not r.timed_out
    assert len(r.stdout) == cap
    assert time.monotonic() - t0 < 2.0  # killed on overflow, not at the timeout


def test_stderr_has_its_own_cap() -> None:
    with LocalSandbox(SandboxConfig(max_output_bytes=100)) as sb:
        r = sb.run("import sys\nprint('ok')\nsys.stderr.write('e' * 1000)\n")
    assert r.output_truncated and r.stdout == "ok\n" and r.stderr == "e" * 100


def test_environment_is_scrubbed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIRL_SECRET_TOKEN", "hunter2-do-not-leak")  # before the workers start
    with LocalSandbox(SandboxConfig(max_workers=1)) as sb:
        r = sb.run("import os\nprint(dict(os.environ))\nprint(sorted(os.environ))\n")
    assert r.status == "ok"
    assert "TIRL_SECRET_TOKEN" not in r.stdout and "hunter2" not in r.stdout
    assert set(eval(r.stdout.splitlines()[1])) == EXPECTED_ENV


def test_cwd_is_fresh_empty_and_removed(single: LocalSandbox) -> None:
    """Each run starts in an empty directory, of one name for every run (a run counter in it would tell a tenant
    how many ran before), whatever the previous run left there."""
    code = "import os, tempfile\nprint(os.getcwd())\nprint(os.listdir('.'))\nprint(tempfile.gettempdir())\n"
    first, second = single.run(code + "open('left', 'w').write('x')\n"), single.run(code)
    cwd1, listing1, tmp1 = first.stdout.splitlines()
    cwd2, listing2, _ = second.stdout.splitlines()
    assert cwd1 == cwd2
    assert listing1 == listing2 == "[]"
    assert tmp1 == cwd1
    # nothing of the earlier runs beside this run's own directory (and an interpreter or checkout under /tmp,
    # bound back in read-only)
    from tirl.sandbox.isolation import ZYGOTE, kept_tmp_entries

    listing = single.run("import os\nprint(sorted(os.listdir('/tmp')))").stdout
    assert listing == f"{sorted([os.path.basename(cwd1), *kept_tmp_entries(sys.executable, str(ZYGOTE))])}\n"


def test_cwd_removed_after_timeout(single: LocalSandbox) -> None:
    r = single.run(
        "import os\nprint(os.getcwd(), flush=True)\nopen('f', 'w').write('x')\nwhile True: pass\n",
        timeout_s=1.0,
    )
    assert r.timed_out
    # The killed worker is replaced, and a fresh worker may reuse the directory's name (pid 1 in its namespace,
    # run 1) for the next run's own, empty cwd: what must be gone is the file the timed-out run wrote.
    stale = os.path.join(r.stdout.strip(), "f")
    assert single.run(f"import os\nprint(os.path.exists({stale!r}))").stdout == "False\n"
    assert not os.path.exists(r.stdout.strip())  # nor on the host: the run's /tmp is the worker's own tmpfs


def test_files_do_not_persist_between_runs(sandbox: LocalSandbox) -> None:
    assert sandbox.run("open('note.txt', 'w').write('secret')").status == "ok"
    r = sandbox.run("import os\nprint(os.path.exists('note.txt'), os.listdir('.'))")
    assert r.stdout == "False []\n"


def test_file_size_limit() -> None:
    with LocalSandbox(SandboxConfig(max_file_bytes=1000)) as sb:
        r = sb.run("with open('big', 'wb') as f:\n    f.write(b'x' * 5000)\n")
    assert r.status == "runtime_error" and "File too large" in r.stderr


@pytest.mark.parametrize(
    "popen_kwargs",
    ["", ", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL"],
    ids=["holds-pipes", "detached-from-pipes"],
)
def test_popen_child_does_not_survive(single: LocalSandbox, popen_kwargs: str) -> None:
    r = single.run(f"import subprocess\np = subprocess.Popen(['sleep', '30']{popen_kwargs})\nprint(p.pid)\n")
    assert r.status == "ok" and int(r.stdout) > 1
    assert r.wall_time < 2.0  # a sleeper holding our pipes open did not make us wait for it
    assert other_pids(single) == ONLY_THE_WORKER


def test_forked_and_setsid_children_do_not_survive(single: LocalSandbox) -> None:
    code = (
        "import os, time\npid = os.fork()\nif pid == 0:\n    os.setsid()\n    time.sleep(30)\n    os._exit(0)\n"
        "print(pid)\n"
    )
    r = single.run(code)
    assert r.status == "ok"
    assert other_pids(single) == ONLY_THE_WORKER


def test_no_state_is_visible_to_the_next_run(single: LocalSandbox) -> None:
    assert single.run("import math, builtins\nmath.leak = 1\nbuiltins.leak = 2\nx = 3").status == "ok"
    r = single.run(
        "import math, builtins\nprint(hasattr(math, 'leak'), hasattr(builtins, 'leak'), 'x' in globals())"
    )
    assert r.stdout == "False False False\n"


def test_a_set_prints_in_the_same_order_in_every_worker_and_pool() -> None:
    """Same snippet, same output: the string hash is fixed for every worker (light and heavy tier, any pool), so
    a tool output that prints a set cannot depend on which worker ran it."""
    code = "print(hash('tirl'), list({f'w{i}' for i in range(32)}))"
    heavy = "import numpy\n" + code
    outs = []
    for _ in range(2):
        with LocalSandbox(SandboxConfig(max_workers=1)) as sb:
            outs += [sb.run(code).stdout, sb.run(heavy).stdout]
    assert outs[0] and len(set(outs)) == 1, outs


def test_preloaded_modules_and_fresh_random_state(single: LocalSandbox) -> None:
    code = "import numpy, sympy, random\nprint(numpy.random.rand(), random.random(), sympy.factorint(12))"
    a, b = single.run(code), single.run(code)
    assert a.status == b.status == "ok" and a.stdout.endswith("{2: 2, 3: 1}\n")
    assert a.stdout.split()[:2] != b.stdout.split()[:2]  # each fork is reseeded


def test_worker_is_replaced_after_max_runs() -> None:
    with LocalSandbox(SandboxConfig(max_workers=1, max_runs_per_worker=2, preload_heavy=())) as sb:
        recycles = []
        for _ in range(4):
            assert sb.run("print(1)").stdout == "1\n"
            recycles.append(sb.stats()["light_recycles"])
    assert recycles == [0, 1, 1, 2], recycles


def test_non_utf8_output_is_replaced(sandbox: LocalSandbox) -> None:
    r = sandbox.run("import sys\nsys.stdout.buffer.write(b'a\\xff\\xfeb')\n")
    assert r.status == "ok"
    assert r.stdout == "a\ufffd\ufffdb"


def test_unicode_round_trip(sandbox: LocalSandbox) -> None:
    assert sandbox.run("print('π ≈ 3.14 ✓')").stdout == "π ≈ 3.14 ✓\n"


def test_a_worker_killed_from_outside_is_replaced() -> None:
    with LocalSandbox(SandboxConfig(max_workers=1)) as sb:
        assert sb.run("print(1)").stdout == "1\n"
        (worker,) = sb._all
        worker.proc.kill()
        worker.proc.wait()
        assert sb.run("print(2)").stdout == "2\n"  # on a fresh worker, not a sandbox_error
        assert sb._all and worker not in sb._all


def test_missing_interpreter_refuses_to_start(tmp_path: Path) -> None:
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    config = SandboxConfig(python=str(fake))
    fake.unlink()  # disappears after validation: the pool must refuse to start with a clear message
    with pytest.raises(SandboxUnavailable, match="does not work here"):
        LocalSandbox(config)


def test_run_batch_keeps_input_order() -> None:
    codes = [f"import time\ntime.sleep({(16 - i) * 0.01})\nprint({i})" for i in range(16)]
    with LocalSandbox(SandboxConfig(max_workers=4)) as sb:
        results = sb.run_batch(codes)
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(16)]
    assert all(isinstance(r, ExecResult) and r.status == "ok" for r in results)


def test_closed_sandbox_refuses_batches() -> None:
    sb = LocalSandbox()
    sb.close()
    with pytest.raises(RuntimeError, match="closed"):
        sb.run_batch(["print(1)"])


def test_to_dict_includes_status(sandbox: LocalSandbox) -> None:
    d = sandbox.run("raise SystemExit(2)").to_dict()
    assert d["status"] == "runtime_error" and d["exit_code"] == 2 and set(d) >= {"stdout", "wall_time"}


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"timeout_s": 0}, "timeout_s"),
        ({"cpu_time_s": -1}, "cpu_time_s"),
        ({"memory_mb": 8}, "memory_mb"),
        ({"max_output_bytes": 0}, "max_output_bytes"),
        ({"max_workers": -1}, "max_workers"),
        ({"python": "/no/such/python"}, "/no/such/python"),
    ],
)
def test_config_validation(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SandboxConfig(**kwargs)


@pytest.mark.parametrize(
    ("result", "status"),
    [
        (ExecResult("", "", 0, False, False, 0.1), "ok"),
        (ExecResult("", "Traceback\nValueError", 1, False, False, 0.1), "runtime_error"),
        (ExecResult("", "", -9, True, False, 1.0), "timeout"),
        (ExecResult("", "", -24, False, False, 1.0), "timeout"),  # SIGXCPU
        (ExecResult("", "MemoryError", 1, False, False, 0.1), "memory_exceeded"),
        (ExecResult("", "MemoryError", 0, False, False, 0.1), "ok"),  # caught and printed
        (ExecResult("x", "", -9, False, True, 0.1), "output_truncated"),
        (ExecResult("", "", None, False, False, 0.0, "OSError: x"), "sandbox_error"),
    ],
)
def test_status_labels(result: ExecResult, status: str) -> None:
    assert result.status == status


LOADED = "import sys\nprint([m for m in ('numpy', 'sympy') if m in sys.modules])"


def test_plain_and_sympy_snippets_run_on_their_tiers(single: LocalSandbox) -> None:
    before = single.stats()
    plain = single.run(LOADED)  # the light tier has imported neither module
    heavy = single.run("import sympy\n" + LOADED + "\nprint(sympy.Integer(2) ** 10)")
    after = single.stats()
    assert plain.status == heavy.status == "ok"
    assert plain.stdout == "[]\n"
    assert heavy.stdout == "['numpy', 'sympy']\n1024\n"  # preloaded on the heavy tier
    assert after["light_runs"] - before["light_runs"] == 1
    assert after["heavy_runs"] - before["heavy_runs"] == 1
    assert after["workers"] == 2  # max_workers is per tier


def test_misrouted_dynamic_import_still_works(single: LocalSandbox) -> None:
    before = single.stats()["light_runs"]
    r = single.run("m = getattr(__builtins__, '__imp' + 'ort__')('sym' + 'py')\nprint(m.Integer(3) ** 2)")
    assert r.status == "ok" and r.stdout == "9\n"
    assert single.stats()["light_runs"] == before + 1  # the router missed it: slower, same result


def test_one_tier_when_preload_heavy_is_empty() -> None:
    cfg = SandboxConfig(max_workers=1, preload=("math", "sympy"), preload_heavy=())
    with LocalSandbox(cfg) as sb:
        r = sb.run("import sympy, sys\nprint('sympy' in sys.modules, sympy.Integer(2) ** 3)")
        stats = sb.stats()
    assert r.stdout == "True 8\n"
    assert stats["workers"] == 1 and stats["light_runs"] == 1 and stats["heavy_runs"] == 0


def test_queue_bound_counts_runs_waiting_for_either_tier() -> None:
    import concurrent.futures as cf

    from tirl.sandbox import SandboxOverloaded

    cfg = SandboxConfig(max_workers=1, max_queue=0)
    sleep = "import time\ntime.sleep(0.5)\nprint('done')"
    codes = [sleep] * 6 + ["import sympy\n" + sleep] * 2
    with LocalSandbox(cfg) as sb:

        def attempt(code: str) -> str:
            try:
                return sb.run(code).stdout
            except SandboxOverloaded:
                return "overloaded"

        with cf.ThreadPoolExecutor(len(codes)) as ex:
            outcomes = list(ex.map(attempt, codes))
        assert sb.stats()["waiting"] == 0
    assert set(outcomes) <= {"done\n", "overloaded"}
    assert outcomes.count("overloaded") >= len(codes) - 2 * sb.workers  # at most workers + max_queue wait
    assert "done\n" in outcomes


def test_works_when_the_host_has_over_1024_open_files() -> None:
    """A training process or a busy server holds many fds; select() cannot watch one numbered >= 1024."""
    fds = [os.open("/dev/null", os.O_RDONLY) for _ in range(1100)]
    try:
        with LocalSandbox(SandboxConfig(max_workers=1, preload_heavy=())) as sb:
            assert sb.run("print(6 * 7)").stdout == "42\n"
    finally:
        for fd in fds:
            os.close(fd)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"memory_mb": -1}, "memory_mb"),
        ({"memory_mb": 5_000_000_000}, "memory_mb"),
        ({"timeout_s": float("inf")}, "timeout_s"),
        ({"timeout_s": 1e12}, "timeout_s"),
    ],
)
def test_bad_run_overrides_raise_clearly_and_lose_no_worker(
    single: LocalSandbox, kwargs: dict, match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        single.run("print(1)", **kwargs)
    # the only worker is back (it used to be lost: the next run hung)
    assert single.stats()["light_idle"] == 1
    assert single.run("print(2)").stdout == "2\n"


def test_close_wakes_runs_waiting_for_a_worker() -> None:
    import threading

    sb = LocalSandbox(SandboxConfig(max_workers=1, preload_heavy=()))
    outcome: dict[str, object] = {}

    def busy() -> None:
        sb.run("import time\ntime.sleep(2)")

    def waiter() -> None:
        try:
            outcome["result"] = sb.run("print(1)")
        except RuntimeError as e:
            outcome["error"] = str(e)

    threads = [threading.Thread(target=f, daemon=True) for f in (busy, waiter)]
    threads[0].start()
    time.sleep(0.3)  # the only worker is busy
    threads[1].start()
    time.sleep(0.3)  # and the second run waits for it
    sb.close()
    threads[1].join(timeout=5)
    assert not threads[1].is_alive()  # it used to wait out the 120 s worker-ready timeout
    assert outcome == {"error": "LocalSandbox is closed"}


def test_snippet_sees_a_real_main_and_none_of_the_workers_modules(sandbox: LocalSandbox) -> None:
    """As under `python snippet.py`: `__builtins__` is the module, and the worker's own modules (zygote.py and its
    siblings, loaded by path inside the sandbox) are neither imported nor importable under their bare names."""
    siblings = ("child", "privileges", "runfiles", "script", "supervise", "wire")
    code = (
        "import sys\nprint(type(__builtins__).__name__, getattr(__builtins__, '__imp' + 'ort__')('math').pi > 3)\n"
        f"print(sorted(m for m in {(*siblings, 'zygote')} if m in sys.modules))\n"
        f"for m in {siblings}:\n    try:\n        __import__(m)\n        print('imported', m)\n"
        "    except ModuleNotFoundError:\n        print('absent', m)\n"
    )
    r = sandbox.run(code)
    absent = "".join(f"absent {m}\n" for m in siblings)
    assert r.status == "ok" and r.stdout == "module True\n[]\n" + absent, r
