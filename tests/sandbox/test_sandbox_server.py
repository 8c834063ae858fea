"""The HTTP layer of `tirl sandbox serve` in-process (ASGI, no sockets), with a stand-in pool."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx

from tirl.sandbox.config import SandboxConfig
from tirl.sandbox.server import create_app
from tirl.sandbox.types import ExecResult


class EchoPool:
    """Stands in for LocalSandbox: answers every run with the code it got."""

    workers = 1
    config = SandboxConfig(timeout_s=5.0, memory_mb=1024, seccomp=False)

    memory_mb: int | None = None
    timeout_s: float | None = None

    def run(self, code: str, *, stdin=None, timeout_s=None, memory_mb=None, **files: object) -> ExecResult:
        self.memory_mb, self.timeout_s = memory_mb, timeout_s
        return ExecResult(code, "", 0, False, False, 0.001)

    def stats(self) -> dict[str, int]:
        tiers = {f"{t}_{k}": 0 for t in ("light", "heavy") for k in ("idle", "busy", "recycles", "runs")}
        return {"waiting": 0, "workers": 1, "idle": 1, **tiers}


def post(app, body: bytes, *, chunked: bool) -> httpx.Response:
    async def chunks() -> AsyncIterator[bytes]:
        for i in range(0, len(body), 1000):
            yield body[i : i + 1000]

    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://sandbox") as c:
            content = chunks() if chunked else body
            return await c.post("/run_code", content=content, headers={"content-type": "application/json"})

    return asyncio.run(go())


def test_chunked_body_over_the_limit_gets_413_not_400() -> None:
    app = create_app(EchoPool(), max_body_bytes=2048)
    r = post(app, b'{"code": "' + b"x" * 10_000 + b'"}', chunked=True)
    assert r.status_code == 413 and "larger than 2048" in r.json()["detail"]
    r = post(app, b'{"code": "' + b"x" * 10_000 + b'"}', chunked=False)
    assert r.status_code == 413


def test_chunked_body_under_the_limit_is_run() -> None:
    app = create_app(EchoPool(), max_body_bytes=4096)
    r = post(app, b'{"code": "' + b"y" * 3000 + b'"}', chunked=True)
    assert r.status_code == 200 and r.json()["run_result"]["stdout"] == "y" * 3000


def run_with(pool: EchoPool, **fields: object) -> httpx.Response:
    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=create_app(pool), raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://sandbox") as c:
            return await c.post("/run_code", json={"code": "print(1)", **fields})

    return asyncio.run(go())


def test_memory_limit_is_a_ceiling_a_request_can_only_lower() -> None:
    """SandboxFusion takes any int (<= 0: no limit); here <= 0 and anything above mean the server's 1024 MB."""
    pool = EchoPool()
    for limit, expected in ((5_000_000_000, 1024), (100_000, 1024), (-1, 1024), (0, 1024), (512, 512)):
        r = run_with(pool, memory_limit_MB=limit)
        assert r.status_code == 200 and pool.memory_mb == expected, (limit, r.text)
        assert r.json()["tirl"]["limits"]["memory_limit_MB"] == expected


def test_run_timeout_is_a_ceiling_and_defaults_to_the_servers() -> None:
    """A request without run_timeout gets sandbox.timeout_s (5 s here), not SandboxFusion's 10 s default."""
    pool = EchoPool()
    for fields, expected in (
        ({}, 5.0),
        ({"run_timeout": 86_400}, 5.0),
        ({"run_timeout": 1e9}, 5.0),
        ({"run_timeout": 0.5}, 0.5),
    ):
        r = run_with(pool, **fields)
        assert r.status_code == 200 and pool.timeout_s == expected, (fields, r.text)
        assert r.json()["tirl"]["limits"]["run_timeout"] == expected
    assert run_with(pool, run_timeout=0).status_code == 422  # not a timeout at all
