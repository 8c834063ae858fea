"""An MCP server for tests/tools/test_mcp.py, written with the `mcp` package's own server API.

    python mcp_test_server.py              # stdio
    python mcp_test_server.py --http PORT  # streamable HTTP on 127.0.0.1:PORT, path /mcp

Its tools each show one behaviour a client must handle: a result (`add`), a long one (`echo`), a server-side error
(`fail`), a late one (`sleep`), non-text content (`picture`), and a process that ignores SIGTERM (`hang`).
"""

import os
import signal
import sys
import time

from mcp.server.mcpserver import Image, MCPServer

server = MCPServer("tirl-test", log_level="WARNING")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def echo(text: str, times: int = 1) -> str:
    """Repeat a text."""
    return text * times


@server.tool()
def fail(message: str) -> str:
    """Always fails, with the message."""
    raise ValueError(message)


@server.tool()
def sleep(seconds: float) -> str:
    """Sleep, then say so."""
    time.sleep(seconds)
    return "slept"


@server.tool()
def picture():
    """A caption and a one-pixel image."""
    return ["a dot", Image(data=b"\x89PNG\r\n", format="png")]


@server.tool()
def pid() -> int:
    """This server's process id."""
    return os.getpid()


@server.tool()
async def hang() -> str:
    """Ignore SIGTERM and block the server's event loop: a hung server, that only SIGKILL ends."""
    signal.signal(
        signal.SIGTERM, signal.SIG_IGN
    )  # an async tool runs in the main thread, where signals are set
    time.sleep(600)
    return "never"


if __name__ == "__main__":
    if sys.argv[1:2] == ["--http"]:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run()
