"""Who may use `tirl sandbox serve`: an optional shared-secret bearer token, and the loopback test for the warning.

The token is read from a file (`--auth-token-file`, `sandbox.auth_token_file`) or the TIRL_SANDBOX_TOKEN
environment variable, never from the config itself (the resolved config is written next to every run). Requests
without `Authorization: Bearer <token>` get 401 on every route; the comparison is constant-time. This is access
control for a trusted network, not transport security: put a TLS reverse proxy in front for anything else.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
from pathlib import Path
from typing import Any

from tirl.errors import TirlError

TOKEN_ENV = "TIRL_SANDBOX_TOKEN"
MIN_TOKEN_CHARS = 16
_HOW = 'generate one with: python -c "import secrets; print(secrets.token_urlsafe(32))"'


class TokenError(TirlError):
    """The token file or variable is unusable (missing, empty, too short)."""


def _checked(token: str, where: str) -> str:
    token = token.strip()
    if len(token) < MIN_TOKEN_CHARS or any(c.isspace() for c in token):
        raise TokenError(
            f"sandbox token from {where} must be one word of at least {MIN_TOKEN_CHARS} characters "
            f"(got {len(token)}); {_HOW}"
        )
    return token


def load_token(path: str | None) -> str | None:
    """The token from `path` when given, else from $TIRL_SANDBOX_TOKEN when set, else None (no authentication)."""
    if path:
        try:
            return _checked(Path(path).read_text(encoding="utf-8"), f"file {path}")
        except OSError as e:
            raise TokenError(f"cannot read the sandbox token file {path}: {e.strerror or e}") from None
    env = os.environ.get(TOKEN_ENV)
    if env is not None:
        return _checked(env, f"${TOKEN_ENV}")
    return None


def is_loopback(host: str) -> bool:
    """True when binding `host` keeps the server reachable from this machine only."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a hostname: it may resolve to anything
        return False


class BearerAuth:
    """ASGI middleware: 401 unless the request carries `Authorization: Bearer <token>` (compared in constant time)."""

    def __init__(self, app: Any, token: str, on_reject: Any = None) -> None:
        self.app, self.on_reject = app, on_reject
        self.expected = f"Bearer {token}".encode()

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        got = dict(scope.get("headers") or []).get(b"authorization", b"")
        if hmac.compare_digest(got, self.expected):
            return await self.app(scope, receive, send)
        if self.on_reject is not None:
            self.on_reject()
        body = b'{"detail":"missing or wrong bearer token: send Authorization: Bearer <the server\'s token>"}'
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"www-authenticate", b"Bearer"),
        ]
        await send({"type": "http.response.start", "status": 401, "headers": headers})
        await send({"type": "http.response.body", "body": body})
