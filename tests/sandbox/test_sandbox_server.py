"""The HTTP layer of `tirl sandbox serve` in-process (ASGI, no sockets), with a stand-in pool."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import httpx
import pytest

from tirl.sandbox.config import SandboxConfig
from tirl.sandbox.server import create_app
from tirl.sandbox.types import ExecResult


class EchoPool:
    """Stands in for LocalSandbox: answers every run with the code it got."""

    workers = 1
    config = SandboxConfig(
        timeout_s=5.0, memory_mb=1024, max_timeout_s=60.0, max_memory_mb=2048, seccomp=False
    )

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


def test_memory_limit_gets_what_it_asks_up_to_the_ceiling() -> None:
    """SandboxFusion takes any int (<= 0: no limit); here <= 0 is the default 1024 MB, anything up to the 2048 MB
    ceiling is granted as asked, and more is clamped to it and reported."""
    pool = EchoPool()
    for limit, expected, clamped in (
        (5_000_000_000, 2048, ["memory_limit_MB"]),
        (100_000, 2048, ["memory_limit_MB"]),
        (-1, 1024, []),
        (0, 1024, []),
        (512, 512, []),
        (1536, 1536, []),  # above the default, within the ceiling: exactly what was asked
        (2048, 2048, []),
    ):
        r = run_with(pool, memory_limit_MB=limit)
        assert r.status_code == 200 and pool.memory_mb == expected, (limit, r.text)
        limits = r.json()["tirl"]["limits"]
        assert limits["memory_limit_MB"] == expected and limits["clamped"] == clamped, (limit, limits)


def test_run_timeout_defaults_to_the_servers_and_is_granted_up_to_the_ceiling() -> None:
    """A request without run_timeout gets sandbox.timeout_s (5 s here, not SandboxFusion's 10 s default); one asking
    for more gets it up to sandbox.max_timeout_s (60 s): the recipe's 30 s is not cut to 5 s."""
    pool = EchoPool()
    for fields, expected, clamped in (
        ({}, 5.0, []),
        ({"run_timeout": 30}, 30.0, []),
        ({"run_timeout": 10}, 10.0, []),
        ({"run_timeout": 60}, 60.0, []),
        ({"run_timeout": 86_400}, 60.0, ["run_timeout"]),
        ({"run_timeout": 1e9}, 60.0, ["run_timeout"]),
        ({"run_timeout": 0.5}, 0.5, []),
    ):
        r = run_with(pool, **fields)
        assert r.status_code == 200 and pool.timeout_s == expected, (fields, r.text)
        limits = r.json()["tirl"]["limits"]
        assert limits["run_timeout"] == expected and limits["clamped"] == clamped, (fields, limits)
    assert run_with(pool, run_timeout=0).status_code == 422  # not a timeout at all


def test_the_servers_limits_are_validated_when_the_config_is_read() -> None:
    """A default above the ceiling, or a memory limit the worker protocol cannot carry (2**20 MB), is a config error
    naming the key: before, `sandbox.memory_mb=10000000000` started and answered 500 to every request."""
    from tirl.commands.run_config import TirlConfig
    from tirl.core.config import ConfigError, load_config

    for override, message in (
        (
            "sandbox.memory_mb=10000000000",
            r"sandbox: memory_mb must be 32-1048576 \(1 TiB\), got 10000000000",
        ),
        ("sandbox.max_memory_mb=10000000000", r"sandbox: max_memory_mb must be 32-1048576"),
        ("sandbox.timeout_s=1e9", r"sandbox: timeout_s must be <= 86400 \(a day\), got 1000000000"),
        (
            "sandbox.timeout_s=200",
            r"max_timeout_s \(120\) is below timeout_s \(200\).*raise sandbox.max_timeout_s",
        ),
        ("sandbox.memory_mb=8192", r"max_memory_mb \(4096\) is below memory_mb \(8192\)"),
    ):
        with pytest.raises(ConfigError, match=message):
            load_config(TirlConfig, None, [override])
    cfg = load_config(TirlConfig, None, ["sandbox.memory_mb=8192", "sandbox.max_memory_mb=16384"]).sandbox
    assert (cfg.memory_mb, cfg.max_memory_mb) == (8192, 16384)


def test_validation_errors_are_counted_as_bad_requests() -> None:
    """FastAPI's 422 answers (bad JSON, a missing `code`, run_timeout <= 0) count in rejected_total like a 400."""
    pool = EchoPool()
    app = create_app(pool)

    async def go() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://sandbox") as c:
            replies = [
                await c.post("/run_code", json={"run_timeout": 1}),
                await c.post("/run_code", json={"code": "print(1)", "run_timeout": -1}),
                await c.post("/run_code", content=b"{not json", headers={"content-type": "application/json"}),
                await c.post("/run_code", json={"code": "print(1)", "language": "cpp"}),  # a 400
                await c.post("/run_code", json={"code": "print(1)"}),
            ]
            return [*replies, await c.get("/metrics")]

    *replies, metrics = asyncio.run(go())
    assert [r.status_code for r in replies] == [422, 422, 422, 400, 200]
    assert 'tirl_sandbox_rejected_total{reason="bad_request"} 4' in metrics.text


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("run_timeout", "NaN"),
        ("run_timeout", "Infinity"),
        ("run_timeout", "-Infinity"),
        ("run_timeout", "1e999"),  # inf once read
        ("memory_limit_MB", "NaN"),
    ],
)
def test_nan_and_inf_get_a_422_whose_body_is_json(field: str, value: str) -> None:
    """Python's JSON reads NaN and Infinity; the 422 echoed them and could not be encoded: a 500 instead."""

    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=create_app(EchoPool()), raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://sandbox") as c:
            body = f'{{"code": "print(1)", "{field}": {value}}}'.encode()
            return await c.post("/run_code", content=body, headers={"content-type": "application/json"})

    def not_json(constant: str) -> None:
        raise AssertionError(f"{constant} in the 422's body: not JSON")

    r = asyncio.run(go())
    assert r.status_code == 422, r.text
    (error,) = json.loads(r.content, parse_constant=not_json)["detail"]
    assert error["loc"] == ["body", field] and isinstance(error["input"], str), error
