"""Who can use `tirl sandbox serve`: bearer token, the open-bind warning, a busy port, `cgroups=off` as documented."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fusion_server import REPO, FusionServer
from test_sandbox_server import EchoPool

from conftest import closed_by_peer
from tirl.commands.run_config import TirlConfig
from tirl.core.config import load_config
from tirl.sandbox.auth import TOKEN_ENV, TokenError, is_loopback, load_token
from tirl.sandbox.client import SandboxClient
from tirl.sandbox.config import SandboxConfig
from tirl.sandbox.server import create_app

TOKEN = "s3cret-token-0123456789abcdef"


def call(app, path: str, headers: dict[str, str] | None = None) -> httpx.Response:
    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://sandbox") as c:
            if path == "/run_code":
                return await c.post(path, json={"code": "print(1)"}, headers=headers or {})
            return await c.get(path, headers=headers or {})

    return asyncio.run(go())


@pytest.mark.parametrize("path", ["/run_code", "/health", "/metrics"])
def test_every_route_needs_the_bearer_token(path: str) -> None:
    """Every route but the liveness probe (GET /health, next test) answers 401 without the token."""
    pool = EchoPool()
    app = create_app(pool, auth_token=TOKEN)
    if path == "/health":  # only GET is open; any other method still needs the token
        r = asyncio.run(_post(app, path))
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer", r.text
        return
    for headers in (
        None,
        {"Authorization": "Bearer wrong"},
        {"Authorization": TOKEN},
        {"Authorization": f"Bearer {TOKEN}x"},
        {"Authorization": f"Basic {TOKEN}"},
    ):
        r = call(app, path, headers)
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer", (headers, r.text)
        assert "bearer token" in r.json()["detail"]
    for scheme in ("Bearer", "bearer", "BEARER", "bEaReR"):  # RFC 7235: the scheme is case-insensitive
        r = call(app, path, {"Authorization": f"{scheme} {TOKEN}"})
        assert r.status_code == 200, (scheme, r.text)


async def _post(app, path: str) -> httpx.Response:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://sandbox") as c:
        return await c.post(path, json={})


def test_get_health_answers_a_probe_without_the_token_with_liveness_alone() -> None:
    """A scheduler's probe carries no secret: GET /health says the server is up and nothing more; with the
    token it gives the load figures."""
    app = create_app(EchoPool(), auth_token=TOKEN)
    for headers in (None, {"Authorization": "Bearer wrong"}):
        r = call(app, "/health", headers)
        assert r.status_code == 200 and r.json() == {"status": "ok"}, r.text
    full = call(app, "/health", {"Authorization": f"Bearer {TOKEN}"})
    assert full.status_code == 200 and "inflight" in full.json()


def test_without_a_token_the_server_stays_open_and_counts_nothing_unauthorized() -> None:
    app = create_app(EchoPool())
    assert call(app, "/run_code").status_code == 200
    assert 'tirl_sandbox_rejected_total{reason="unauthorized"} 0' in call(app, "/metrics").text


def test_token_sources_and_their_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    assert load_token(None) is None
    f = private_file(tmp_path / "token", TOKEN + "\n")
    assert load_token(str(f)) == TOKEN
    monkeypatch.setenv(TOKEN_ENV, "env-token-abcdefghijkl")
    assert load_token(None) == "env-token-abcdefghijkl" and load_token(str(f)) == TOKEN  # the file wins
    f.write_text("short")
    with pytest.raises(
        TokenError, match=r"file .*token must be one word of at least 16 characters \(got 5\)"
    ):
        load_token(str(f))
    with pytest.raises(TokenError, match="cannot read the sandbox token file .*missing"):
        load_token(str(tmp_path / "missing"))


def private_file(path: Path, text: str | bytes) -> Path:
    """A token file as the docs say to make one: mode 0600."""
    path.touch(mode=0o600)
    path.chmod(0o600)
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return path


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660, 0o606], ids=oct)
def test_a_token_file_open_to_other_users_is_refused_naming_the_file_and_the_fix(
    tmp_path: Path, mode: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A token others on the machine can read protects nothing: the server and the client both refuse it."""
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    f = private_file(tmp_path / "token", TOKEN)
    f.chmod(mode)
    expected = rf"sandbox token file {f} is open to other users \(mode 0{mode:o}\).*run `chmod 600 {f}`"
    with pytest.raises(TokenError, match=expected):
        load_token(str(f))
    with pytest.raises(TokenError, match=expected):  # the remote client reads it the same way
        SandboxClient(SandboxConfig(backend="remote", urls=("http://x",), auth_token_file=str(f)))
    f.chmod(0o400)
    assert load_token(str(f)) == TOKEN


def test_a_token_file_that_is_not_utf8_is_refused_naming_the_file(tmp_path: Path) -> None:
    f = private_file(tmp_path / "token", b"\xff\xfe" + TOKEN.encode("utf-16-le"))
    with pytest.raises(
        TokenError, match=rf"sandbox token file {f} is not UTF-8 text \(byte 0xff at offset 0\)"
    ):
        load_token(str(f))


def test_a_token_that_is_not_printable_ascii_is_refused_by_the_server_and_the_client_alike(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A header carries ASCII: before, the server took a token with an "ö" that tirl's own client could not send."""
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    f = private_file(tmp_path / "token", "t\u00f6ken-abcdefghijklmnop\n")
    expected = rf"sandbox token from file {f} must be printable ASCII.*character 1 is '\u00f6' \(U\+00F6\)"
    with pytest.raises(TokenError, match=expected):
        load_token(str(f))  # as `tirl sandbox serve` reads it
    with pytest.raises(TokenError, match=expected):
        SandboxClient(SandboxConfig(backend="remote", urls=("http://x",), auth_token_file=str(f)))
    monkeypatch.setenv(TOKEN_ENV, "token-abcdefghijklmnop\x7f")
    with pytest.raises(TokenError, match=rf"from \${TOKEN_ENV} must be printable ASCII.*'\\x7f' \(U\+007F\)"):
        load_token(None)


def test_client_sends_the_token_from_config_file_or_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[str | None] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("authorization"))
        body = {
            "status": "Success",
            "message": "",
            "run_result": {"status": "Finished", "return_code": 0, "stdout": "1\n", "stderr": ""},
        }
        return httpx.Response(200, json=body)

    monkeypatch.setenv(TOKEN_ENV, "env-token-abcdefghijkl")
    with SandboxClient(
        SandboxConfig(backend="remote", urls=("http://x",)), transport=httpx.MockTransport(handler)
    ) as c:
        assert c.run("print(1)").stdout == "1\n"
    f = private_file(tmp_path / "token", TOKEN)
    cfg = SandboxConfig(backend="remote", urls=("http://x",), auth_token_file=str(f))
    with SandboxClient(cfg, transport=httpx.MockTransport(handler)) as c:
        c.run("print(1)")
    monkeypatch.delenv(TOKEN_ENV)
    with SandboxClient(
        SandboxConfig(backend="remote", urls=("http://x",)), transport=httpx.MockTransport(handler)
    ) as c:
        c.run("print(1)")
    assert seen == ["Bearer env-token-abcdefghijkl", f"Bearer {TOKEN}", None]


def test_loopback_hosts() -> None:
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.8.0.1", "::1", "[::1]", "localhost"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "::", "10.0.0.5", "example.org"))


def serve(*args: str, timeout: int = 60, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`tirl sandbox serve` that is expected to exit by itself (an error before or while starting)."""
    cmd = [sys.executable, "-m", "tirl.cli", "sandbox", "serve", *args]
    env = {
        **{k: v for k, v in os.environ.items() if k != TOKEN_ENV},
        "PYTHONPATH": str(REPO / "src"),
        **(env or {}),
    }
    return subprocess.run(
        ["timeout", "-s", "KILL", str(timeout), *cmd], env=env, capture_output=True, text=True
    )


def test_busy_port_fails_clearly_before_saying_serving() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = serve("--port", str(port), "sandbox.isolation=none", "sandbox.seccomp=false")
    assert r.returncode == 2, r.stderr
    assert f"cannot listen on 127.0.0.1:{port}: address already in use" in r.stderr
    assert "serving" not in r.stderr and "Traceback" not in r.stderr


def test_open_bind_without_token_warns_loudly_and_a_bad_token_file_stops_it(tmp_path: Path) -> None:
    with socket.socket() as s:  # a busy port ends the server right after the warning
        s.bind(("0.0.0.0", 0))
        s.listen()
        port = s.getsockname()[1]
        r = serve("--host", "0.0.0.0", "--port", str(port), "sandbox.isolation=none")
    assert "WARNING: tirl sandbox: binding 0.0.0.0" in r.stderr and "WITHOUT a token" in r.stderr
    assert TOKEN_ENV in r.stderr and "--auth-token-file" in r.stderr
    r = serve("--host", "0.0.0.0", "--port", str(port), "--auth-token-file", str(tmp_path / "none"))
    assert (
        r.returncode == 2 and "cannot read the sandbox token file" in r.stderr and "WARNING" not in r.stderr
    )
    r = serve("--host", "0.0.0.0", "--port", str(port), f"sandbox.auth_token_file={tmp_path / 'cfg-token'}")
    assert r.returncode == 2 and f"token file {tmp_path / 'cfg-token'}" in r.stderr  # read from the config


def test_a_host_that_does_not_resolve_fails_before_the_open_bind_warning() -> None:
    r = serve("--host", "not a host", "--port", "0", "sandbox.isolation=none")
    assert r.returncode == 2 and "--host 'not a host' does not resolve to an address" in r.stderr, r.stderr
    assert "WARNING" not in r.stderr and "Traceback" not in r.stderr, r.stderr


# -- a real server: limits, read deadline, signals ---------------------------------------------------------------
@pytest.fixture(scope="module")
def small_server() -> Iterator[FusionServer]:
    """Defaults 1 s / 64 MB, ceilings 4 s / 512 MB, and a 1 s deadline for a complete request."""
    srv = FusionServer(
        "--workers", "1", "--read-timeout", "1", "sandbox.isolation=none", "sandbox.preload_heavy=[]",
        "sandbox.timeout_s=1", "sandbox.max_timeout_s=4", "sandbox.memory_mb=64", "sandbox.max_memory_mb=512",
    )  # fmt: skip
    try:
        yield srv
    finally:
        srv.close()


def test_a_request_above_the_default_and_within_the_ceiling_gets_what_it_asks(
    small_server: FusionServer,
) -> None:
    """As on SandboxFusion, `run_timeout: 3` for a 1.5 s snippet runs it to the end, though the server's default
    (for requests that do not ask) is 1 s; the same for memory. Above the ceiling the request is clamped."""
    sleeper = {"code": "import time\ntime.sleep(1.5)\nprint('done')", "language": "python"}
    r = small_server.post({**sleeper, "run_timeout": 3})
    assert r["status"] == "Success" and r["run_result"]["stdout"] == "done\n", r
    assert r["tirl"]["limits"] == {"run_timeout": 3, "memory_limit_MB": 64, "clamped": []}
    r = small_server.post(sleeper)
    assert r["run_result"]["status"] == "TimeLimitExceeded" and r["tirl"]["limits"]["run_timeout"] == 1
    hog = {"code": "x = bytearray(200 * 2**20)\nprint('allocated')", "language": "python"}
    r = small_server.post({**hog, "memory_limit_MB": 400})  # the workers' cgroups hold the ceiling, not 64 MB
    assert r["status"] == "Success" and r["run_result"]["stdout"] == "allocated\n", r
    r = small_server.post(hog)
    assert r["status"] == "Failed" and "MemoryError" in r["run_result"]["stderr"]
    r = small_server.post(
        {"code": "print(1)", "language": "python", "run_timeout": 30, "memory_limit_MB": 10**6}
    )
    assert r["status"] == "Success"
    assert r["tirl"]["limits"] == {
        "run_timeout": 4,
        "memory_limit_MB": 512,
        "clamped": ["run_timeout", "memory_limit_MB"],
    }


def test_connections_that_never_send_a_complete_request_are_closed(small_server: FusionServer) -> None:
    """Idle, stalled-header and stalled-body connections are closed after --read-timeout (1 s here): uvicorn's
    keep-alive timeout covers only the wait between requests. A run longer than that is not cut."""
    head = b"POST /run_code HTTP/1.1\r\nHost: sandbox\r\n"
    body = head + b'Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"code": "pri'
    socks: list[socket.socket] = []
    try:
        for data in (b"", head, body, head, body + b"nt(1)"):
            s = socket.create_connection(("127.0.0.1", small_server.port), timeout=10)
            s.sendall(data)
            socks.append(s)
        slow = {"code": "import time\ntime.sleep(2)\nprint('slow')", "language": "python", "run_timeout": 3}
        assert small_server.post(slow)["run_result"]["stdout"] == "slow\n"  # 2 s on a connection: not cut
        deadline = time.monotonic() + 8
        assert [closed_by_peer(s, max(0.1, deadline - time.monotonic())) for s in socks] == [True] * len(
            socks
        )
    finally:
        for s in socks:
            s.close()
    assert small_server.post({"code": "print(2)", "language": "python"})["run_result"]["stdout"] == "2\n"


def _worker_cgroups(server_pid: int) -> list[Path]:
    """The `tirl-sandbox-<pid>-*` cgroups beside this process's own (the server inherits our cgroups)."""
    found = []
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        roots = [c.removeprefix("name=") for c in controllers.split(",")] if controllers else ["", "unified"]
        for root in roots:
            found += (Path("/sys/fs/cgroup") / root / path.lstrip("/")).glob(f"tirl-sandbox-{server_pid}-*")
    return found


@pytest.mark.slow
def test_sigterm_shuts_down_like_sigint_and_removes_the_worker_cgroups() -> None:
    srv = FusionServer("--workers", "2", "sandbox.isolation=none", "sandbox.preload_heavy=[]")
    try:
        pid = srv.server_pid
        if not _worker_cgroups(pid):
            pytest.skip("the server runs its workers without cgroups here (none writable)")
        assert srv.post({"code": "print(1)", "language": "python"})["status"] == "Success"
        os.kill(pid, signal.SIGTERM)
        code = srv.proc.wait(timeout=60)
    finally:
        srv.close()
    logs = srv.logs()
    assert _worker_cgroups(pid) == [], logs
    assert code == 0 and logs.strip().splitlines()[-1] == "tirl sandbox: stopped (SIGTERM); workers closed", (
        logs
    )


@pytest.mark.slow
def test_sigint_stops_the_server_with_one_line_and_no_traceback() -> None:
    srv = FusionServer("--workers", "1", "sandbox.isolation=none", "sandbox.preload_heavy=[]")
    try:
        assert srv.post({"code": "print(1)", "language": "python"})["status"] == "Success"
        os.kill(srv.server_pid, signal.SIGINT)
        code = srv.proc.wait(timeout=60)
    finally:
        srv.close()
    logs = srv.logs()
    assert "Traceback" not in logs and "KeyboardInterrupt" not in logs, logs
    assert code == 0 and logs.strip().splitlines()[-1] == "tirl sandbox: stopped (SIGINT); workers closed", (
        logs
    )


def test_cgroups_off_from_the_command_line_and_yaml(tmp_path: Path) -> None:
    """YAML 1.1 reads a bare `off` as false; the documented value must still mean "off"."""
    assert load_config(TirlConfig, None, ["sandbox.cgroups=off"]).sandbox.cgroups == "off"
    f = tmp_path / "c.yaml"
    f.write_text("sandbox:\n  cgroups: off\n")
    assert load_config(TirlConfig, f).sandbox.cgroups == "off"
    with pytest.raises(Exception, match="must be one of \\['auto', 'required', 'off'\\], got True"):
        load_config(TirlConfig, None, ["sandbox.cgroups=true"])


def test_official_sandboxfusion_client_sends_the_token_through_a_session() -> None:
    """sandbox-fusion's `run_code` calls `requests.post` and takes no headers: give its module a Session that has
    the header (the recipe docs/sandbox-service.md shows). Without it the server answers 401."""
    sandbox_fusion = pytest.importorskip(
        "sandbox_fusion", reason="the sandbox-fusion client (dev extra) is missing"
    )
    import requests
    import sandbox_fusion.client as fusion_client

    srv = FusionServer("--workers", "1", "sandbox.isolation=none", "sandbox.preload_heavy=[]", token=TOKEN)
    req = sandbox_fusion.RunCodeRequest(code="print(6 * 7)", language="python")
    try:
        with pytest.raises(Exception, match="code 401"):
            sandbox_fusion.run_code(req, endpoint=srv.url, max_attempts=1, client_timeout=60)
        session = requests.Session()
        session.headers["Authorization"] = f"Bearer {TOKEN}"
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(fusion_client, "requests", session)
            r = sandbox_fusion.run_code(req, endpoint=srv.url, max_attempts=1, client_timeout=60)
        assert r.run_result.stdout == "42\n"
        # GET /health answers a probe without the token, liveness alone; the stats need the token
        open_health, full_health = httpx.get(f"{srv.url}/health"), srv.http.get("/health")
        assert open_health.status_code == 200 and open_health.json() == {"status": "ok"}
        assert full_health.status_code == 200 and "inflight" in full_health.json()
        assert (
            httpx.post(f"{srv.url}/health").status_code in (401, 405)
            and httpx.get(f"{srv.url}/metrics").status_code == 401
        )
    finally:
        srv.close()
    assert "auth bearer token" in srv.logs()
