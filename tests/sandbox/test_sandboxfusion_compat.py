"""The official `sandbox-fusion` client (PyPI) and verl's exact request shapes against a real `tirl sandbox serve`.

verl's reward code (verl/utils/reward_score/sandbox_fusion) posts {compile_timeout, run_timeout, code, stdin,
language, files: {}, fetch_files: []} (newer versions add memory_limit_MB) and scores a case: SandboxError -> -1;
Failed with run_result TimeLimitExceeded -> -3, Error or Finished with a non-zero code -> -2; Success with
run_result Finished -> stdout compared after stripping trailing newlines. Its SandboxFusion tool sends the same body
with stdin "None" and shows stdout + stderr when the run_result is Finished. `verl_score` below restates that rule.
"""

from __future__ import annotations

import base64
import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

sandbox_fusion = pytest.importorskip(
    "sandbox_fusion", reason="the sandbox-fusion client (dev extra) is missing"
)
from fusion_server import FusionServer  # noqa: E402
from sandbox_fusion import RunCodeRequest, RunStatus, SummaryMapping, run_code, summary_run_code_result  # noqa: E402

pytestmark = pytest.mark.skipif(
    shutil.which("bwrap") is None, reason="needs bubblewrap (the default isolation)"
)


@pytest.fixture(scope="module")
def server() -> Iterator[FusionServer]:
    # defaults 10 s (SandboxFusion's) / 256 MB for requests that do not ask; up to 60 s / 512 MB for those that do
    srv = FusionServer(
        "--workers", "2", "sandbox.memory_mb=256", "sandbox.max_memory_mb=512", "sandbox.timeout_s=10",
        "sandbox.max_timeout_s=60", "sandbox.preload_heavy=[]",
    )  # fmt: skip
    try:
        yield srv
    finally:
        srv.close()


def client_run(server: FusionServer, code: str, **fields: object):
    """One request through the official client (which raises on SandboxError and on any non-200)."""
    req = RunCodeRequest(code=code, language="python", **fields)
    return run_code(req, endpoint=server.url, max_attempts=1, client_timeout=60)


def verl_body(code: str, stdin: str, timeout: int, **extra: object) -> dict:
    body = {"compile_timeout": timeout, "run_timeout": timeout, "code": code, "stdin": stdin}
    return {**body, "language": "python", "files": {}, "fetch_files": [], **extra}


def verl_score(reply: dict, expected: str) -> bool | int:
    status, run = reply.get("status"), reply.get("run_result")
    if status == "SandboxError":
        return -1
    if status == "Failed":
        if not run:
            return -1
        if run["status"] == "TimeLimitExceeded":
            return -3
        if run["status"] == "Error" or run.get("return_code") != 0:
            return -2
        return -1
    if status == "Success" and run and run["status"] == "Finished":
        return (run["stdout"] or "").rstrip("\n") == expected.rstrip("\n")
    return -1


# -- the official client -----------------------------------------------------------------------------------------
def test_client_print_stdin_and_summary(server: FusionServer) -> None:
    r = client_run(server, "import sys\nprint(sum(map(int, sys.stdin.read().split())))", stdin="1 2 3\n")
    assert r.status == RunStatus.Success and r.run_result.stdout == "6\n" and r.run_result.return_code == 0
    assert r.compile_result is None and r.files == {} and r.run_result.execution_time > 0
    assert summary_run_code_result(r, SummaryMapping()) == "Success"


def test_client_exception_exit_code_and_syntax_error(server: FusionServer) -> None:
    r = client_run(server, "raise ValueError('boom')")
    assert r.status == RunStatus.Failed and r.run_result.return_code == 1
    assert "ValueError: boom" in r.run_result.stderr
    assert summary_run_code_result(r, SummaryMapping(RunFailed="RE")) == "RE"
    r = client_run(server, "import sys\nprint('partial')\nsys.exit(3)")
    assert (
        r.status == RunStatus.Failed and r.run_result.return_code == 3 and r.run_result.stdout == "partial\n"
    )
    r = client_run(server, "def f(:\n  pass")
    assert (
        r.status == RunStatus.Failed
        and r.run_result.return_code == 1
        and "SyntaxError" in r.run_result.stderr
    )


def test_client_timeout_has_no_return_code(server: FusionServer) -> None:
    r = client_run(server, "print('started', flush=True)\nwhile True:\n    pass", run_timeout=1)
    assert r.status == RunStatus.Failed and r.run_result.status == "TimeLimitExceeded"
    assert r.run_result.return_code is None and r.run_result.stdout == "started\n"
    assert summary_run_code_result(r, SummaryMapping(RunTimeout="TLE")) == "TLE"


def test_client_memory_limit(server: FusionServer) -> None:
    r = client_run(server, "x = bytearray(2 * 2**30)\nprint('allocated')")
    assert r.status == RunStatus.Failed and r.run_result.return_code != 0
    assert "MemoryError" in r.run_result.stderr and r.run_result.stdout == ""


def test_client_files_upload_and_fetch(server: FusionServer) -> None:
    code = (
        "import os\ndata = open('inputs/deep/data.txt').read()\nos.makedirs('out', exist_ok=True)\n"
        "open('out/result.bin', 'wb').write(bytes(range(256)))\nprint(data.upper())"
    )
    files = {"inputs/deep/data.txt": base64.b64encode("héllo".encode()).decode(), "skipped.txt": None}
    r = client_run(server, code, files=files, fetch_files=["out/result.bin", "missing.txt"])
    assert r.status == RunStatus.Success and r.run_result.stdout == "HÉLLO\n"
    assert set(r.files) == {"out/result.bin"}  # a file that does not exist is left out, as SandboxFusion does
    assert base64.b64decode(r.files["out/result.bin"]) == bytes(range(256))


def test_client_large_output_up_to_one_mib_per_stream(server: FusionServer) -> None:
    r = client_run(server, "import sys\nsys.stdout.write('x' * 900_000)\nsys.stderr.write('e' * 300_000)")
    assert r.status == RunStatus.Success
    assert len(r.run_result.stdout) == 900_000 and len(r.run_result.stderr) == 300_000
    r = client_run(server, "import sys\nsys.stdout.write('y' * (2**20 + 10))")
    assert r.status == RunStatus.Failed and len(r.run_result.stdout) == 2**20  # cut at 1 MiB (and killed)


@pytest.mark.slow
def test_client_long_cpu_bound_run_within_run_timeout(server: FusionServer) -> None:
    """6 s of CPU, within the 40 s it asks for (above the 10 s default, below the 60 s ceiling): runs to the end."""
    code = (
        "import time\nt = time.process_time()\nwhile time.process_time() - t < 6.0:\n    pass\nprint('done')"
    )
    r = client_run(server, code, run_timeout=40)
    assert r.status == RunStatus.Success and r.run_result.stdout == "done\n", r


def test_client_unjoined_thread_and_atexit_output_arrive(server: FusionServer) -> None:
    code = (
        "import atexit, threading, time\n"
        "def solve():\n    time.sleep(0.3)\n    print('answer 42')\n"
        "atexit.register(lambda: print('atexit ran'))\n"
        "threading.Thread(target=solve).start()\nprint('main done')\n"
    )
    r = client_run(server, code)
    assert r.status == RunStatus.Success
    assert r.run_result.stdout == "main done\nanswer 42\natexit ran\n"


def test_client_buffers_left_open_are_flushed_at_exit(server: FusionServer) -> None:
    """As at Python's exit: a buffered stdout wrapper and a file never closed (held in globals) keep their data."""
    code = (
        "import os\nout = os.fdopen(1, 'w', closefd=False)\nout.write('fast io')\n"
        "log = open('log.txt', 'w')\nlog.write('kept')\n"
    )
    r = client_run(server, code, fetch_files=["log.txt"])
    assert r.status == RunStatus.Success and r.run_result.stdout == "fast io"
    assert base64.b64decode(r.files["log.txt"]) == b"kept"


def test_client_unicode_round_trips(server: FusionServer) -> None:
    r = client_run(server, "s = input()\nprint(s[::-1], '✓ 中文 🙂')", stdin="αβγ\n")
    assert r.status == RunStatus.Success and r.run_result.stdout == "γβα ✓ 中文 🙂\n"


def test_client_concurrency(server: FusionServer) -> None:
    with ThreadPoolExecutor(12) as ex:
        replies = list(ex.map(lambda i: client_run(server, f"print({i} * {i})"), range(48)))
    assert [r.run_result.stdout for r in replies] == [f"{i * i}\n" for i in range(48)]


# -- the raw reply ---------------------------------------------------------------------------------------------
def test_reply_has_every_documented_key_with_sandboxfusion_types(server: FusionServer) -> None:
    reply = server.post({"code": "print(1)", "language": "python", "compile_timeout": 1.5})
    assert {"status", "message", "compile_result", "run_result", "executor_pod_name", "files"} <= set(reply)
    assert reply["status"] == "Success" and reply["message"] == "" and reply["compile_result"] is None
    assert reply["executor_pod_name"] is None and reply["files"] == {}
    run = reply["run_result"]
    assert set(run) == {"status", "execution_time", "return_code", "stdout", "stderr"}
    assert run["status"] == "Finished" and isinstance(run["execution_time"], float)
    assert run["return_code"] == 0 and run["stdout"] == "1\n" and run["stderr"] == ""


def test_request_bounds_sandboxfusion_accepts(server: FusionServer) -> None:
    """Long run_timeouts and any memory_limit_MB are accepted, as SandboxFusion accepts them: granted as asked up
    to the server's ceilings (60 s, 512 MB), clamped above them; the reply reports what the run got."""
    for extra, limits in (
        ({"run_timeout": 3600}, (60, 256, ["run_timeout"])),
        ({"run_timeout": 30, "memory_limit_MB": 400}, (30, 400, [])),  # verl's recipe asks 30 s
        ({"memory_limit_MB": 0}, (10, 256, [])),
        ({"memory_limit_MB": 10**9}, (10, 512, ["memory_limit_MB"])),
        ({"memory_limit_MB": 128, "run_timeout": 2}, (2, 128, [])),
        ({"stdin": None}, (10, 256, [])),
    ):
        reply = server.post({"code": "print('ok')", "language": "python", **extra})
        assert reply["status"] == "Success" and reply["run_result"]["stdout"] == "ok\n", (extra, reply)
        got = reply["tirl"]["limits"]
        assert (got["run_timeout"], got["memory_limit_MB"], got["clamped"]) == limits, (extra, got)


# -- verl's request shapes -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("code", "stdin", "expected", "score"),
    [
        ("a, b = map(int, input().split())\nprint(a + b)", "2 3\n", "5", True),
        ("a, b = map(int, input().split())\nprint(a - b)", "2 3\n", "5", False),
        ("print(1 / 0)", "", "", -2),
        ("import sys\nsys.exit(2)", "", "", -2),
        ("def broken(:", "", "", -2),
        ("while True:\n    pass", "", "", -3),
        ("import threading\nthreading.Thread(target=lambda: print(7)).start()", "", "7", True),
    ],
)
def test_verl_reward_request_is_scored_as_on_sandboxfusion(
    server: FusionServer, code: str, stdin: str, expected: str, score: bool | int
) -> None:
    assert verl_score(server.post(verl_body(code, stdin, 2)), expected) == score
    assert verl_score(server.post(verl_body(code, stdin, 2, memory_limit_MB=1024)), expected) == score


def test_verl_tool_request_shows_stdout_and_stderr(server: FusionServer) -> None:
    reply = server.post(verl_body("import sys\nprint('out')\nprint('warn', file=sys.stderr)", "None", 10))
    run = reply["run_result"]
    assert reply["status"] == "Success" and run["status"] == "Finished"
    assert run["stdout"] + run["stderr"] == "out\nwarn\n"


@pytest.mark.slow
def test_failed_runs_are_logged_with_status_and_reason() -> None:
    srv = FusionServer("--workers", "1", "sandbox.preload_heavy=[]")
    try:
        srv.post({"code": "raise KeyError('missing-key')", "language": "python"})
        srv.post({"code": "while True: pass", "language": "python", "run_timeout": 0.5})
        srv.post({"code": "print('fine')", "language": "python"})
    finally:
        srv.close()
    lines = [x for x in srv.logs().splitlines() if "run failed" in x]
    assert len(lines) == 2, lines
    assert "status=runtime_error" in lines[0] and "KeyError: 'missing-key'" in lines[0]
    assert "status=timeout" in lines[1] and "0.5 s wall clock" in lines[1]
