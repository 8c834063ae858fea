"""`python -m tirl.launch.wait` against a real local HTTP server: it waits through 503s, sends each server its
secret, and gives up at --timeout naming what did not answer."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tirl.launch.wait import main


class Health(BaseHTTPRequestHandler):
    """/health: 503 for the first `busy` requests, then 200; 401 without `Bearer <secret>` when a secret is set."""

    busy = 0
    secret = ""
    seen: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        type(self).seen.append(self.headers.get("Authorization", ""))
        if self.path != "/health":
            code = 404
        elif self.secret and self.headers.get("Authorization") != f"Bearer {self.secret}":
            code = 401
        else:
            code = 503 if len(self.seen) <= self.busy else 200
        self.send_response(code)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def server() -> Iterator:
    def start(busy: int = 0, secret: str = "") -> str:
        handler = type("H", (Health,), {"busy": busy, "secret": secret, "seen": []})
        httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        servers.append((httpd, handler))
        return f"http://127.0.0.1:{httpd.server_address[1]}"

    servers: list = []
    yield start, servers
    for httpd, _ in servers:
        httpd.shutdown()
        httpd.server_close()


def test_waits_through_503_then_exits_0(server, capsys) -> None:
    start, servers = server
    url = start(busy=2)
    assert main([url, "--every", "0.05", "--timeout", "20", "--progress-s", "0.01"]) == 0
    assert len(servers[0][1].seen) == 3  # two 503s, then the 200
    err = capsys.readouterr().err
    assert f"waiting for {url} (HTTP 503)" in err and f"{url} answers" in err and "all 1 answer" in err


def test_sends_the_key_to_vllm_and_the_token_to_the_sandbox(server, tmp_path, monkeypatch) -> None:
    start, servers = server
    vllm, sandbox = start(secret="the-vllm-key"), start(secret="the-sandbox-token")
    (tmp_path / "token").write_text("the-sandbox-token\n")
    monkeypatch.setenv("TIRL_VLLM_API_KEY", "the-vllm-key")
    argv = [vllm, "--sandbox", sandbox, "--sandbox-token-file", str(tmp_path / "token"), "--every", "0.05"]
    assert main([*argv, "--timeout", "20"]) == 0
    assert servers[0][1].seen == ["Bearer the-vllm-key"] and servers[1][1].seen == [
        "Bearer the-sandbox-token"
    ]


def test_a_wrong_secret_is_reported_as_what_the_server_said(server, capsys) -> None:
    start, _ = server
    url = start(secret="right")
    assert main(["--sandbox", url, "--timeout", "0.3", "--every", "0.05"]) == 1
    assert f"{url} (HTTP 401)" in capsys.readouterr().err


def test_an_unreachable_url_times_out_with_exit_1_naming_it() -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    began = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "tirl.launch.wait", "--timeout", "2", "--every", "0.2", url],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert f"1 of 1 did not answer GET /health with 200: {url} (ConnectError" in result.stderr
    assert time.monotonic() - began < 30  # a guard against a hang only: it gives up at --timeout


@pytest.mark.parametrize(
    "argv, message",
    [([], "name at least one URL"), (["node1:8000"], "not an http(s) URL: node1:8000"),
     (["http://a", "--sandbox-token-file", "/nonexistent/token"], "--sandbox-token-file /nonexistent/token")],
)  # fmt: skip
def test_bad_arguments_exit_2_naming_them(argv, message, capsys) -> None:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    assert message in capsys.readouterr().err
