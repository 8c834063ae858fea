"""One MCP client session, held open on its own event loop in a background thread: what `McpServer` calls through.

The `mcp` client is async (anyio); tirl calls tools from threads (`ToolSet.execute`). So the session lives in one
task of a private asyncio loop run by a daemon thread: that task connects (a command: it starts the server process
and speaks stdio to it; an http(s) URL: streamable HTTP), lists the tools, and waits until it is told to stop; each
call is one more task on the loop, started from any thread, with its own timeout. Closing stops the session in the
task that opened it (anyio's rule), and for a process the `mcp` stdio transport then stops the server: stdin
closed, SIGTERM to its process group after 2 s, SIGKILL 2 s later. Every wait here is bounded, so a server that
hangs can neither hang tirl nor outlive `close()`.

Deliberately not here: tirl's tools (`tirl.tools.mcp`), and authentication or custom HTTP headers for a URL.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import os
import tempfile
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tirl.core.errors import TirlError

# the mcp stdio shutdown waits at most ~6.5 s (0.5 s flush, 2 s after closing stdin, 2 s after SIGTERM, 2 s after
# SIGKILL): a close that takes longer than this has a stuck event loop, and is abandoned (the thread is a daemon)
CLOSE_TIMEOUT_S = 15.0
STDERR_TAIL_BYTES = 2000  # how much of a failed server's stderr an error quotes


class McpServerError(TirlError):
    """An MCP server did not start, did not answer, or offers a tool whose name is taken."""


def import_mcp() -> Any:
    """The `mcp` package, imported on first use: tirl runs without it."""
    try:
        import mcp
    except ImportError as e:
        raise ImportError(f"MCP tools need the `mcp` package ({e}): pip install 'tirl[mcp]'") from None
    return mcp


def is_url(server: str | Sequence[str]) -> bool:
    return isinstance(server, str) and server.startswith(("http://", "https://"))


def reasons(error: BaseException) -> str:
    """An error in one line: the leaves of an exception group (anyio's task groups wrap every failure in one)."""
    if isinstance(error, BaseExceptionGroup):
        return "; ".join(dict.fromkeys(reasons(e) for e in error.exceptions))
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__


class McpSession:
    """A connected MCP client: `tools` (the server's listing), `call` from any thread, `close` (idempotent)."""

    def __init__(
        self,
        server: str | Sequence[str],
        *,
        label: str,
        connect_timeout_s: float,
        max_concurrent_calls: int,
        env: Mapping[str, str] | None = None,
        cwd: str | Path | None = None,
        stderr_path: str | Path | None = None,
    ) -> None:
        mcp = import_mcp()
        self.label = label
        self._stderr = None
        if is_url(server):
            client = mcp.Client(server)
        else:
            argv = list(server)  # the caller split a command line (`McpServer`)
            # the server's stderr: a file the user named, else a temporary one whose end an error quotes
            self._stderr = open(stderr_path, "ab") if stderr_path else tempfile.TemporaryFile()  # noqa: SIM115
            params = mcp.StdioServerParameters(command=argv[0], args=argv[1:], env=dict(env or {}), cwd=cwd)
            client = mcp.Client(mcp.stdio_client(params, errlog=self._stderr))
        self._loop = asyncio.new_event_loop()
        self._stop = asyncio.Event()
        self._slots = asyncio.Semaphore(max_concurrent_calls)
        self._ready: concurrent.futures.Future[list[Any]] = concurrent.futures.Future()
        self._ended = threading.Event()
        self._failure: BaseException | None = None
        self._client: Any = None
        self._closed = False
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"tirl-mcp {label}", daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._hold(client), self._loop)
        try:
            self.tools = self._wait_ready(connect_timeout_s)
        except BaseException:
            self.close()
            raise
        atexit.register(self.close)  # a session left open still stops its server when Python exits

    async def _hold(self, client: Any) -> None:
        """Connect, list the tools, and keep the session open until `_stop`, which also cancels a connect."""
        import anyio

        try:
            async with anyio.create_task_group() as group:

                async def stop_on_request() -> None:
                    await self._stop.wait()
                    group.cancel_scope.cancel()

                group.start_soon(stop_on_request)
                async with client:
                    tools, cursor = [], None
                    while True:
                        page = await client.list_tools(cursor=cursor)
                        tools += page.tools
                        cursor = page.next_cursor
                        if not cursor:
                            break
                    self._client = client
                    self._ready.set_result(tools)
                    await anyio.sleep_forever()  # until stop_on_request cancels the group
        except BaseException as e:  # the server failed or went away: kept for the error of every later call
            self._failure = e
            if not self._ready.done():
                self._ready.set_exception(e)
        finally:
            self._ended.set()

    @property
    def closed(self) -> bool:
        return self._closed

    def _wait_ready(self, timeout_s: float) -> list[Any]:
        if not concurrent.futures.wait([self._ready], timeout=timeout_s).done:
            raise McpServerError(
                f"MCP server {self.label!r} did not answer within connect_timeout_s={timeout_s:g} s"
                f"{self.stderr_tail()}"
            )
        error = self._ready.exception()
        if error is not None:
            raise McpServerError(
                f"MCP server {self.label!r} failed to start or to connect: {reasons(error)}{self.stderr_tail()}"
            )
        return self._ready.result()

    def stderr_tail(self) -> str:
        """The end of the server process's stderr, as a sentence for an error ("" if it wrote none, or a URL)."""
        if self._stderr is None or self._stderr.closed:
            return ""
        self._stderr.flush()
        size = os.fstat(self._stderr.fileno()).st_size
        with open(self._stderr.fileno(), "rb", closefd=False) as f:
            f.seek(max(0, size - STDERR_TAIL_BYTES))
            tail = f.read().decode("utf-8", "replace").strip()
        return f"; its stderr ends:\n{tail}" if tail else ""

    def call(self, name: str, arguments: dict[str, Any], timeout_s: float) -> concurrent.futures.Future[Any]:
        """Start one call of tool `name`; the future holds its `CallToolResult`, or raises TimeoutError past
        `timeout_s` (which counts the wait for one of the `max_concurrent_calls` slots), or the failure."""
        failed: concurrent.futures.Future[Any] = concurrent.futures.Future()
        if self._closed or self._ended.is_set():
            why = "closed" if self._closed else f"gone ({reasons(self._failure or EOFError())})"
            failed.set_exception(ConnectionError(f"the session is {why}"))
            return failed
        coro = self._call(name, arguments, timeout_s)
        try:
            return asyncio.run_coroutine_threadsafe(coro, self._loop)
        except RuntimeError:  # closed meanwhile, by another thread: its loop is gone
            coro.close()
            failed.set_exception(ConnectionError("the session is closed"))
            return failed

    async def _call(self, name: str, arguments: dict[str, Any], timeout_s: float) -> Any:
        async def call() -> Any:
            async with self._slots:
                return await self._client.call_tool(name, arguments)

        return await asyncio.wait_for(call(), timeout_s)

    def close(self) -> None:
        """End the session and, for a command, stop the server process (killed if it does not exit)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        atexit.unregister(self.close)
        self._loop.call_soon_threadsafe(self._stop.set)
        self._ended.wait(CLOSE_TIMEOUT_S)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5.0)  # the loop stops at once unless a stuck task holds it
        if not self._thread.is_alive():
            self._loop.close()
        if self._stderr is not None:
            self._stderr.close()
