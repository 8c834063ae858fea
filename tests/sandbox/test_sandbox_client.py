"""SandboxFusion wire format and SandboxClient: mapping both ways, round-robin, retries, giving up cleanly, and a
reply too large to read."""

from __future__ import annotations

import http.server
import json
import math
import threading
from collections.abc import Iterator

import httpx
import pytest

from tirl.sandbox import ExecResult, SandboxClient, SandboxConfig, build_sandbox
from tirl.sandbox.fusion import from_response, request_body, to_response


@pytest.mark.parametrize(
    "result",
    [
        ExecResult("42\n", "", 0, False, False, 0.01),
        ExecResult("", "Traceback\nValueError", 1, False, False, 0.01),
        ExecResult("started\n", "", -9, True, False, 1.0),
        ExecResult("", "", -24, False, False, 1.0),  # SIGXCPU
        ExecResult("x" * 10, "", -9, False, True, 0.1),
        ExecResult("", "", -9, False, False, 0.1, memory_exceeded=True),
        ExecResult("", "", None, False, False, 0.0, "worker died"),
    ],
)
def test_tirl_response_round_trips(result: ExecResult) -> None:
    back = from_response(json.loads(json.dumps(to_response(result))), wall_time=9.0)
    assert back.status == result.status
    assert (back.stdout, back.stderr, back.exit_code) == (result.stdout, result.stderr, result.exit_code)


def test_sandboxfusion_statuses() -> None:
    ok = to_response(ExecResult("hi\n", "", 0, False, False, 0.03))
    assert ok["status"] == "Success" and ok["run_result"]["status"] == "Finished"
    assert to_response(ExecResult("", "", 1, False, False, 0.03))["status"] == "Failed"
    tle = to_response(ExecResult("", "", -9, True, False, 1.0))
    assert tle["status"] == "Failed" and tle["run_result"]["status"] == "TimeLimitExceeded"
    assert to_response(ExecResult("", "", None, False, False, 0.0, "boom"))["status"] == "SandboxError"


def test_real_sandboxfusion_answers_without_the_tirl_extension() -> None:
    # The documented example answer of SandboxFusion, and a time-limit answer with no return code.
    ok = {"status": "Success", "message": "", "compile_result": None,
          "run_result": {"status": "Finished", "execution_time": 0.03, "return_code": 0,
                         "stdout": "Hello, world!\n", "stderr": ""}}  # fmt: skip
    r = from_response(ok, wall_time=0.1)
    assert (r.status, r.stdout, r.wall_time) == ("ok", "Hello, world!\n", 0.03)
    tle = {"status": "Failed", "message": "",
           "run_result": {"status": "TimeLimitExceeded", "execution_time": 1.0, "return_code": None,
                          "stdout": "", "stderr": ""}}  # fmt: skip
    assert from_response(tle, wall_time=1.0).status == "timeout"
    err = from_response({"status": "SandboxError", "message": "no pod", "run_result": None}, wall_time=0.1)
    assert err.status == "sandbox_error" and err.sandbox_error == "no pod"
    assert from_response({"oops": 1}, wall_time=0.1).status == "sandbox_error"


def test_request_body_is_what_verl_sends() -> None:
    body = request_body("print(1)", stdin=None, timeout_s=5.0)
    assert set(body) == {"code", "language", "stdin", "compile_timeout", "run_timeout", "memory_limit_MB",
                         "files", "fetch_files"}  # fmt: skip
    assert body["language"] == "python" and body["run_timeout"] == 5.0 and body["memory_limit_MB"] == -1


def _client(handler, urls=("http://a:1", "http://b:2"), retries=3) -> SandboxClient:
    cfg = SandboxConfig(backend="remote", urls=urls, retries=retries, max_workers=4)
    return SandboxClient(cfg, transport=httpx.MockTransport(handler))


def _ok(stdout: str) -> httpx.Response:
    return httpx.Response(200, json=to_response(ExecResult(stdout, "", 0, False, False, 0.01)))


def test_round_robin_and_retry_on_5xx_429_and_connection_errors() -> None:
    seen: list[str] = []
    answers = iter(["503", "429", "connect", "ok"])

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.host)
        what = next(answers)
        if what == "connect":
            raise httpx.ConnectError("refused", request=request)
        return _ok("fine\n") if what == "ok" else httpx.Response(int(what), text="busy")

    with _client(handler) as client:
        r = client.run("print('fine')")
    assert r.status == "ok" and r.stdout == "fine\n"
    assert seen == ["a", "b", "a", "b"]  # each retry goes to the next server


def test_gives_up_after_retries_with_a_sandbox_error() -> None:
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        raise httpx.ReadTimeout("slow", request=request)

    with _client(handler, retries=2) as client:
        r = client.run("print(1)")
    assert r.status == "sandbox_error" and "ReadTimeout" in r.sandbox_error and len(calls) == 3


def test_4xx_is_not_retried() -> None:
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        return httpx.Response(400, json={"detail": "language 'cpp' is not supported"})

    with _client(handler) as client:
        r = client.run("print(1)")
    assert r.status == "sandbox_error" and "not supported" in r.sandbox_error and len(calls) == 1


def test_run_batch_keeps_order_and_passes_stdin() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        return _ok(f"{body['code']}|{body['stdin']}")

    with _client(handler) as client:
        results = client.run_batch(["a", "b", "c"], stdins=["1", None, "3"])
        with pytest.raises(ValueError, match="3 snippets but 1 stdins"):
            client.run_batch(["a", "b", "c"], stdins=["1"])
    assert [r.stdout for r in results] == ["a|1", "b|None", "c|3"]


def test_build_sandbox_remote_and_config_errors() -> None:
    with build_sandbox(SandboxConfig(backend="remote", urls=("http://127.0.0.1:9",))) as sb:
        assert isinstance(sb, SandboxClient)
    with pytest.raises(ValueError, match="needs sandbox.urls"):
        SandboxConfig(backend="remote")
    with pytest.raises(ValueError, match="not an http"):
        SandboxConfig(backend="remote", urls=("localhost:8080",))


@pytest.mark.parametrize(
    "run_result",
    [
        {"status": "Finished", "execution_time": "abc"},
        {"status": "Finished", "stdout": 5, "return_code": 0},
        {"status": "Finished", "stdout": "", "return_code": "0"},
    ],
)
def test_malformed_run_result_is_a_sandbox_error_not_an_exception(run_result: dict) -> None:
    r = from_response({"status": "Success", "run_result": run_result, "tirl": None}, wall_time=1.0)
    assert r.status == "sandbox_error" and "malformed" in r.sandbox_error


def test_lone_surrogates_are_replaced_not_raised() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        return _ok(f"{body['code']}|{body['stdin']}")

    with _client(handler) as client:
        r = client.run("print('\ud800')", stdin="\udcff")
    assert r.status == "ok" and r.stdout == "print('?')|?"


def test_a_nan_or_infinite_timeout_is_refused_before_sending() -> None:
    with _client(lambda request: _ok("")) as client:
        for timeout in (math.nan, math.inf):
            with pytest.raises(ValueError, match=r"timeout_s must be > 0 and finite, got (nan|inf)"):
                client.run("print(1)", timeout_s=timeout)


class HugeReply(http.server.BaseHTTPRequestHandler):
    """A server without an output cap: every POST gets a valid reply whose stdout is 64 MiB, sent in 64 KiB writes;
    `posts` counts the requests, `sent` the bytes it managed to send, `done` is set when it stops."""

    STDOUT_BYTES = 64 * 2**20
    posts = sent = 0
    done = threading.Event()

    def do_POST(self) -> None:
        HugeReply.posts += 1
        self.rfile.read(int(self.headers["Content-Length"]))
        head = b'{"status": "Success", "message": "", "run_result": {"status": "Finished", "return_code": 0, '
        head += b'"stderr": "", "stdout": "'
        tail = b'"}}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(head) + self.STDOUT_BYTES + len(tail)))
        self.end_headers()
        try:
            self.wfile.write(head)
            for _ in range(self.STDOUT_BYTES // 2**16):
                self.wfile.write(b"x" * 2**16)
                HugeReply.sent += 2**16
            self.wfile.write(tail)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client hung up
        finally:
            HugeReply.done.set()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def huge_reply_server() -> Iterator[str]:
    HugeReply.posts = HugeReply.sent = 0
    HugeReply.done.clear()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), HugeReply)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def test_a_reply_past_the_output_cap_is_not_read_on(huge_reply_server: str) -> None:
    """A server answering 400 MB of stdout grew the client by 1.2 GB: the reply is read up to what two streams of
    sandbox.max_output_bytes take in JSON (6 bytes a byte, + 64 KiB), then the connection is dropped."""
    cfg = SandboxConfig(backend="remote", urls=(huge_reply_server,), retries=2, max_output_bytes=1024)
    with SandboxClient(cfg) as client:
        r = client.run("print('x' * 10**9)")
    assert r.status == "sandbox_error" and r.output_truncated and r.stdout == "", r
    assert HugeReply.done.wait(10) and HugeReply.sent < HugeReply.STDOUT_BYTES  # the client stopped reading
    assert HugeReply.posts == 1  # not retried: the next server would send as much
    assert r.sandbox_error.startswith(
        f"remote sandbox reply too large: {huge_reply_server}/run_code sent over 77824 bytes"  # 12 x 1024 + 64 KiB
    )
    with SandboxClient(SandboxConfig(urls=("http://x",))) as client:
        assert client.max_reply_bytes == 12 * 2**20 + 2**16  # the default 1 MiB a stream
