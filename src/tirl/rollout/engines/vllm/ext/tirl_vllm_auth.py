"""Inside a vLLM server: every route answers only a request that carries the run's key.

Started with `--middleware tirl_vllm_auth.RequireKey`, this directory on PYTHONPATH and the key in
`$TIRL_VLLM_API_KEY`, the server answers a request (HTTP or WebSocket, any path and method) only when it carries
`Authorization: Bearer <key>`; every other one gets 401 before any route runs. One exception: `GET /health`
(vLLM's liveness route, an empty 200) answers anyone, because a scheduler's probes (Kubernetes, a load balancer,
`tirl.launch.wait`) carry no secret, and it tells only that the server is up. vLLM's own `--api-key` guards only
the paths under /v1, /v2, /inference and /cohere (vllm 0.32), not the ones `VLLM_SERVER_DEV_MODE=1` opens
(`/collective_rpc`, `/sleep`, `/wake_up`, `/reset_prefix_cache`, `/pause`, `/update_weights`, `/server_info`, ...)
nor `/tokenize` or `/invocations`, so tirl's servers carry this one. Without the key in its environment the server
does not start (fails closed).

A plain ASGI middleware: imports only the standard library (the key is compared as SHA-256 digests, in constant time
and without giving away its length).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

KEY_ENV = "TIRL_VLLM_API_KEY"
Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]]
HEALTH = "/health"  # GET only: open to probes (module docstring)
REFUSAL = json.dumps(
    {"error": f"Unauthorized: this vLLM server answers only requests with the run's key (${KEY_ENV})"}
).encode()


def bearer(key: str) -> bytes:
    """The Authorization header's value that carries `key`."""
    return b"Bearer " + key.encode()


class RequireKey:
    """The middleware (module docstring). `key`: the one to require (default `$TIRL_VLLM_API_KEY`)."""

    def __init__(self, app: ASGIApp, key: str | None = None) -> None:
        key = os.environ.get(KEY_ENV, "") if key is None else key
        if not key:
            raise RuntimeError(
                f"tirl_vllm_auth.RequireKey: ${KEY_ENV} is empty; the server would be open to all"
            )
        self.app = app
        self._want = hashlib.sha256(bearer(key)).digest()

    def allows(self, scope: Scope) -> bool:
        """Whether the request's first Authorization header carries the key (or it is the open liveness probe)."""
        if scope["type"] == "http" and scope.get("method") == "GET" and scope.get("path") == HEALTH:
            return True
        got = next((v for k, v in scope.get("headers", ()) if k.lower() == b"authorization"), b"")
        return hmac.compare_digest(hashlib.sha256(bytes(got)).digest(), self._want)

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket") or self.allows(scope):  # lifespan events pass
            await self.app(scope, receive, send)
        elif scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})  # before accept: the client sees a 403
        else:
            headers = [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(REFUSAL)).encode()),
                (b"www-authenticate", b"Bearer"),
            ]
            await send({"type": "http.response.start", "status": 401, "headers": headers})
            await send({"type": "http.response.body", "body": REFUSAL})
