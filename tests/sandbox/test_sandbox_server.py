"""The HTTP layer of `tirl sandbox serve` in-process (ASGI, no sockets), with a stand-in pool."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx

from tirl.sandbox.server import create_app
from tirl.sandbox.types import ExecResult


class EchoPool:
    """Stands in for LocalSandbox: answers every run with the code it got."""

    workers = 1

    memory_mb: int | None = None

    def run(self, code: str, *, stdin=None, timeout_s=None, memory_mb=None, **files: object) -> ExecResult:
        self.memory_mb = memory_mb
        return ExecResult(code, "", 0, False, False, 0.001)

    def stats(self) -> dict[str, int]:
        return {"waiting": 0, "workers": 1, "idle": 1}


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


def test_memory_limits_map_as_sandboxfusion_accepts_them() -> None:
    """SandboxFusion takes any int: <= 0 means no limit (here: the server's own), a huge one is clamped to 1 TiB."""
    pool = EchoPool()

    async def go(limit: int) -> httpx.Response:
        transport = httpx.ASGITransport(app=create_app(pool), raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://sandbox") as c:
            return await c.post("/run_code", json={"code": "print(1)", "memory_limit_MB": limit})

    for limit, expected in ((5_000_000_000, 2**20), (-1, None), (0, None), (512, 512)):
        r = asyncio.run(go(limit))
        assert r.status_code == 200 and pool.memory_mb == expected, (limit, r.text)
