"""Who may use `tirl sandbox serve`: an optional shared-secret bearer token, and the loopback test for the warning.

The token is read from a file (`--auth-token-file`, `sandbox.auth_token_file`) or the TIRL_SANDBOX_TOKEN
environment variable, never from the config itself (the resolved config is written next to every run). A token file
must be private to its owner (no permission bits for group or others: `chmod 600 FILE`), else it is refused, on the
server and in the client alike: a token anyone on the machine can read protects nothing. So is a token with a
character other than printable ASCII, again on both sides: an HTTP header cannot carry it as text (the client could
not send what the server would expect). Requests without `Authorization: Bearer <token>` (the scheme in any case,
as RFC 7235 says) get 401 on every route; the comparison is constant-time. This is access control for a trusted
network, not transport security: put a TLS reverse proxy in front for anything else.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
import stat
from typing import Any

from tirl.core.errors import TirlError

TOKEN_ENV = "TIRL_SANDBOX_TOKEN"
MIN_TOKEN_CHARS = 16
_HOW = 'generate one with: python -c "import secrets; print(secrets.token_urlsafe(32))"'


class TokenError(TirlError):
    """The token file or variable is unusable (missing, open to other users, not UTF-8, not printable ASCII, empty,
    too short)."""


def _checked(token: str, where: str) -> str:
    token = token.strip()
    if len(token) < MIN_TOKEN_CHARS or any(c.isspace() for c in token):
        raise TokenError(
            f"sandbox token from {where} must be one word of at least {MIN_TOKEN_CHARS} characters "
            f"(got {len(token)}); {_HOW}"
        )
    bad = next((i for i, c in enumerate(token) if not "!" <= c <= "~"), None)
    if bad is not None:  # the client could not send it in a header, so the server must not expect it
        raise TokenError(
            f"sandbox token from {where} must be printable ASCII, as an HTTP header carries it: character "
            f"{bad} is {token[bad]!r} (U+{ord(token[bad]):04X}); {_HOW}"
        )
    return token


def load_token(path: str | None) -> str | None:
    """The token from `path` when given, else from $TIRL_SANDBOX_TOKEN when set, else None (no authentication)."""
    if path:
        return _checked(_read_private(path), f"file {path}")
    env = os.environ.get(TOKEN_ENV)
    if env is not None:
        return _checked(env, f"${TOKEN_ENV}")
    return None


def _read_private(path: str) -> str:
    """The text of token file `path`; TokenError naming the file when it is unreadable, open to others or not UTF-8."""
    try:
        with open(path, "rb") as f:
            mode = stat.S_IMODE(os.fstat(f.fileno()).st_mode)
            data = f.read()
    except OSError as e:
        raise TokenError(f"cannot read the sandbox token file {path}: {e.strerror or e}") from None
    if mode & 0o077:
        raise TokenError(
            f"sandbox token file {path} is open to other users (mode {mode:04o}); a token must be private to its "
            f"owner: run `chmod 600 {path}`"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TokenError(
            f"sandbox token file {path} is not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start}); "
            f"{_HOW}"
        ) from None


def is_loopback(host: str) -> bool:
    """True when binding `host` keeps the server reachable from this machine only."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a hostname: it may resolve to anything
        return False


class BearerAuth:
    """ASGI middleware: 401 unless the request carries `Authorization: Bearer <token>` (compared in constant time);
    `GET /health` without it gets `{"status": "ok"}` alone, for probes that carry no secret."""

    def __init__(self, app: Any, token: str, on_reject: Any = None) -> None:
        self.app, self.on_reject = app, on_reject
        self.expected = token.encode()

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        scheme, _, credentials = dict(scope.get("headers") or []).get(b"authorization", b"").partition(b" ")
        # the scheme is case-insensitive (RFC 7235: "bearer", "BEARER"); the token is compared in constant time
        if hmac.compare_digest(credentials.lstrip(b" "), self.expected) and scheme.lower() == b"bearer":
            return await self.app(scope, receive, send)
        if (
            scope.get("method") == "GET" and scope.get("path") == "/health"
        ):  # a scheduler's probe has no token:
            return await _reply(send, 200, LIVE, [])  # it learns that the server is up, not its load
        if self.on_reject is not None:
            self.on_reject()
        body = b'{"detail":"missing or wrong bearer token: send Authorization: Bearer <the server\'s token>"}'
        await _reply(send, 401, body, [(b"www-authenticate", b"Bearer")])


LIVE = b'{"status":"ok"}'  # GET /health without the token: liveness alone (the stats need the token)


async def _reply(send: Any, status: int, body: bytes, extra: list[tuple[bytes, bytes]]) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *extra]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
