"""Who can use `tirl sandbox serve`: bearer token, the open-bind warning, a busy port, `cgroups=off` as documented."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from fusion_server import REPO, FusionServer
from test_sandbox_server import EchoPool

from tirl.config import load_config
from tirl.run_config import TirlConfig
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
    pool = EchoPool()
    app = create_app(pool, auth_token=TOKEN)
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
    r = call(app, path, {"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 200, r.text


def test_without_a_token_the_server_stays_open_and_counts_nothing_unauthorized() -> None:
    app = create_app(EchoPool())
    assert call(app, "/run_code").status_code == 200
    assert 'tirl_sandbox_rejected_total{reason="unauthorized"} 0' in call(app, "/metrics").text


def test_token_sources_and_their_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    assert load_token(None) is None
    f = tmp_path / "token"
    f.write_text(TOKEN + "\n")
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
    f = tmp_path / "token"
    f.write_text(TOKEN)
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
        assert (
            httpx.get(f"{srv.url}/health").status_code == 401 and srv.http.get("/health").status_code == 200
        )
    finally:
        srv.close()
    assert "auth bearer token" in srv.logs()
