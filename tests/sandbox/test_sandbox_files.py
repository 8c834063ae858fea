"""`files` and `fetch_files` names checked on the host (tirl/sandbox/files.py) before a run reaches a worker: a name
the worker cannot encode, and two names for one path, are refused naming them, locally and through the server."""

from __future__ import annotations

import asyncio
import base64
import re
import shutil
from collections.abc import Iterator

import httpx
import pytest

from tirl.sandbox import LocalSandbox, SandboxConfig
from tirl.sandbox.files import file_request
from tirl.sandbox.server import create_app

B64 = base64.b64encode(b"x").decode()
needs_bwrap = pytest.mark.skipif(
    shutil.which("bwrap") is None, reason="needs bubblewrap (the default isolation)"
)


@pytest.fixture(scope="module")
def pool() -> Iterator[LocalSandbox]:
    """One worker: a run that killed it would show in `light_recycles`."""
    with LocalSandbox(SandboxConfig(timeout_s=10.0, max_workers=1, preload_heavy=())) as sb:
        yield sb


@pytest.mark.parametrize(
    ("files", "fetch", "match"),
    [
        (
            {"\ud800": B64},
            [],
            r"files path '\\ud800' is not valid Unicode: '\\ud800' at index 0 is a lone surrogate",
        ),
        (
            {},
            ["out/\udcff.txt"],
            r"fetch_files path 'out/\\udcff.txt' is not valid Unicode: '\\udcff' at index 4",
        ),
    ],
    ids=["files", "fetch_files"],
)
def test_a_lone_surrogate_in_a_name_is_refused_naming_it(files: dict, fetch: list, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        file_request(files, fetch)


@pytest.mark.parametrize("other", ["a//b", "./a/b", "a/./b", "a/b/"])
def test_two_files_names_for_one_path_are_refused(other: str) -> None:
    """Before, both were written to a/b, the last one winning without a word."""
    expected = rf"files: 'a/b' and '{re.escape(other)}' are the same path 'a/b'; name each file once"
    with pytest.raises(ValueError, match=expected):
        file_request({"a/b": B64, other: base64.b64encode(b"y").decode()}, [])


@needs_bwrap
def test_a_lone_surrogate_fetch_path_leaves_the_local_worker_alive(pool: LocalSandbox) -> None:
    """Before, `fetch_files=["\\ud800"]` reached the worker, which died encoding it ("worker exited (code 1)")."""
    recycles = pool.stats()["light_recycles"]
    with pytest.raises(ValueError, match="lone surrogate"):
        pool.run("print(1)", fetch_files=["\ud800"])
    r = pool.run("print(2)")
    assert r.status == "ok" and r.stdout == "2\n" and pool.stats()["light_recycles"] == recycles, r


@needs_bwrap
def test_bad_names_get_a_400_naming_them_from_the_server(pool: LocalSandbox) -> None:
    bodies = [
        (
            b'{"code": "print(1)", "fetch_files": ["\\ud800"]}',
            "fetch_files path '\\ud800' is not valid Unicode",
        ),
        (
            b'{"code": "print(1)", "files": {"\\ud800": "eA=="}}',
            "files path '\\ud800' is not valid Unicode",
        ),
        (
            b'{"code": "print(1)", "files": {"a/b": "eA==", "a//b": "eA=="}}',
            "'a/b' and 'a//b' are the same path",
        ),
    ]

    async def go() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=create_app(pool), raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://sandbox") as c:
            headers = {"content-type": "application/json"}
            replies = [await c.post("/run_code", content=body, headers=headers) for body, _ in bodies]
            return [*replies, await c.post("/run_code", json={"code": "print(3)"})]

    recycles = pool.stats()["light_recycles"]
    *refused, ok = asyncio.run(go())
    for r, (_, message) in zip(refused, bodies, strict=True):
        assert r.status_code == 400 and message in r.json()["detail"], r.text
    assert ok.status_code == 200 and ok.json()["run_result"]["stdout"] == "3\n", ok.text
    assert pool.stats()["light_recycles"] == recycles
