"""SandboxFusion wire format and SandboxClient: mapping both ways, round-robin, retries, giving up cleanly."""

from __future__ import annotations

import json

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
