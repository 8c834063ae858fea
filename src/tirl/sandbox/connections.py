"""The connections of `tirl sandbox serve`: the listening socket, bound before anything says "serving", a deadline
for each connection to deliver a complete request, and SIGTERM stopping uvicorn the way SIGINT does.

A connection must deliver a complete request (headers and body) within `read_timeout_s` of its opening or of the
previous response, else it is closed: idle and stalled connections cannot pile up. SIGTERM and SIGINT stop the
server the same way: no new connections, running requests finish, then the caller closes the pool. uvicorn is
imported only when the server starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import signal
import socket
import threading
from collections.abc import Iterator
from typing import Any

from tirl.core.errors import TirlError


def resolve(host: str, port: int) -> tuple[Any, ...]:
    """`host`'s first address to bind (getaddrinfo's family, type, proto, name, address); a host that does not
    resolve is a one-line error."""
    try:
        return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    except (socket.gaierror, UnicodeError) as e:
        raise TirlError(f"--host {host!r} does not resolve to an address to bind: {e}") from None


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound before anything says "serving"; a taken port is a one-line error."""
    family, kind, proto, _, addr = resolve(host, port)
    sock = socket.socket(family, kind, proto)
    # SO_REUSEADDR as uvicorn sets it: a port in TIME_WAIT is reusable, one with a live listener still is not
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
        sock.listen(2048)
    except OSError as e:
        sock.close()
        what = "address already in use" if e.errno == errno.EADDRINUSE else (e.strerror or str(e))
        raise TirlError(
            f"cannot listen on {host}:{port}: {what}; pick another --port, or stop the process using it"
        ) from None
    return sock


def read_deadline_protocol(read_timeout_s: float) -> type:
    """uvicorn's HTTP protocol, closing a connection that has not sent a complete request `read_timeout_s` after it
    opened or after its previous response (uvicorn's keep-alive timeout starts only after a first response, and
    nothing bounds a stalled header or body). The deadline is not reset by data: a trickle does not extend it."""
    try:  # the class uvicorn's http="auto" picks
        import httptools  # noqa: F401
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as Base
    except ImportError:
        from uvicorn.protocols.http.h11_impl import H11Protocol as Base

    class ReadDeadline(Base):  # type: ignore[misc, valid-type]
        _deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._disarm()
            if not self.transport.is_closing():
                self._deadline = self.loop.call_later(read_timeout_s, self._expired)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _expired(self) -> None:
            self._deadline = None
            cycle = self.cycle
            if cycle is not None and not cycle.response_complete and not cycle.more_body:
                return  # a complete request being answered: the next deadline starts with its response
            self.transport.close()

    return ReadDeadline


def stoppable_server(config: Any) -> Any:
    """A uvicorn.Server that stops on SIGTERM exactly as on SIGINT and then returns (uvicorn re-raises the signal
    after its shutdown: SIGTERM then killed the process before the pool's cgroups were removed, and SIGINT printed
    a KeyboardInterrupt traceback). Its `stopped_by` names the signal."""
    import uvicorn

    class Server(uvicorn.Server):
        stopped_by: str | None = None

        def handle_exit(self, sig: int, frame: Any) -> None:
            self.stopped_by = self.stopped_by or signal.Signals(sig).name
            super().handle_exit(sig, frame)

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            old = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for sig, handler in old.items():
                    signal.signal(sig, handler)

    return Server(config)
