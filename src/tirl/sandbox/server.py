"""`tirl sandbox serve`: the warm pool behind SandboxFusion's HTTP API (FastAPI + uvicorn).

POST /run_code  SandboxFusion request/response (Python only; other languages get a 400 saying so)
GET  /health    pool size, idle workers, waiting runs
GET  /metrics   Prometheus text: runs by status, run latency histogram, queue depth, rejected requests, and per
                tier (light/heavy): idle and busy workers, recycled workers, runs routed there

Overload never hangs a client: beyond `workers + queue` runs in flight the server answers 429 at once
(`tirl.sandbox.admission`), and a request body over the size limit gets 413 (unread when Content-Length says so,
else as soon as it passes the limit). Every run that does not end `ok` is logged (logger `tirl.sandbox`, one line:
status and reason).

A request gets the limits it asks for up to the server's ceilings, else the defaults (`tirl.sandbox.run_request`);
the limits a run got, and which were clamped, come back in the reply's `tirl.limits`. With a token (auth.py) every
route needs `Authorization: Bearer <token>`. The socket, the per-connection read deadline and the signals that stop
the server are `tirl.sandbox.connections`'.
"""

# No `from __future__ import annotations`: FastAPI must see the request model class defined in create_app.

import logging
import math
import socket
from typing import Any

from tirl.sandbox.admission import Admission, log
from tirl.sandbox.auth import BearerAuth
from tirl.sandbox.config import SandboxConfig
from tirl.sandbox.connections import read_deadline_protocol, stoppable_server
from tirl.sandbox.fusion import to_response
from tirl.sandbox.local import LocalSandbox
from tirl.sandbox.prometheus import Metrics
from tirl.sandbox.run_request import checked_request, limits_for, request_model


class BodyLimit:
    """ASGI middleware: 413 for bodies over `max_bytes`, by Content-Length up front or while streaming."""

    def __init__(self, app: Any, max_bytes: int, metrics: Metrics) -> None:
        self.app, self.max_bytes, self.metrics = app, max_bytes, metrics

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_bytes):
            return await self._reject(send)
        # Read the whole body here (it is small by construction) rather than raising from inside the app's
        # receive: FastAPI turns any error while reading the body into a 400, so a chunked upload without a
        # Content-Length would get "error parsing the body" instead of 413.
        chunks, seen = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return None
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:
                return await self._reject(send)
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay_receive() -> dict:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": b"".join(chunks), "more_body": False}

        return await self.app(scope, replay_receive, send)

    async def _reject(self, send: Any) -> None:
        self.metrics.rejected["too_large"] += 1
        body = f'{{"detail":"request body larger than {self.max_bytes} bytes"}}'.encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def create_app(
    sandbox: LocalSandbox,
    *,
    max_body_bytes: int = 4 * 2**20,
    max_queue: int = 256,
    auth_token: str | None = None,
    limits: SandboxConfig | None = None,
) -> Any:
    """The FastAPI app serving `sandbox`; at most workers + max_queue requests are admitted at once.

    `auth_token`: when set, every request must carry it as a bearer token (else 401). `limits`: the config whose
    defaults and ceilings requests get (default: the pool's own).
    """
    from fastapi import FastAPI, Request
    from fastapi.encoders import jsonable_encoder
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, PlainTextResponse

    RunCodeRequest = request_model()
    metrics = Metrics()
    admission = Admission(sandbox, metrics, max_queue)
    app = FastAPI(title="tirl sandbox", version="1")
    limits = limits or sandbox.config

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> Any:
        metrics.rejected["bad_request"] += 1  # a 422: not JSON, a missing `code`, a run_timeout <= 0, NaN...
        # FastAPI's own 422, except that an echoed NaN or inf input (JSON has neither) goes as text: else
        # encoding the answer fails and the client gets a 500
        return JSONResponse(status_code=422, content={"detail": _finite(jsonable_encoder(exc.errors()))})

    @app.post("/run_code")
    async def run_code(req: RunCodeRequest) -> dict:
        files = checked_request(req, metrics)
        got = limits_for(req.run_timeout, req.memory_limit_MB, limits)
        timeout, memory = got["run_timeout"], got["memory_limit_MB"]
        result = await admission.run(req.code, req.stdin, timeout, memory, files, req.fetch_files)
        reply = to_response(result)
        reply["tirl"]["limits"] = got
        return reply

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "inflight": admission.inflight, **sandbox.stats()}

    @app.get("/metrics", response_class=PlainTextResponse)
    async def prometheus() -> str:
        return metrics.render(sandbox.stats(), admission.inflight)

    return _guarded(app, max_body_bytes, auth_token, metrics)


def _guarded(app: Any, max_body_bytes: int, auth_token: str | None, metrics: Metrics) -> Any:
    """`app` behind the body limit and, with a token, the bearer check outside it; each refusal counted."""
    guarded = BodyLimit(app, max_body_bytes, metrics)
    if auth_token is None:
        return guarded

    def unauthorized() -> None:
        metrics.rejected["unauthorized"] += 1

    return BearerAuth(guarded, auth_token, on_reject=unauthorized)


def _finite(value: Any) -> Any:
    """`value` (decoded JSON) with every NaN or infinite float replaced by its text ("nan", "inf", "-inf")."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def serve(
    sandbox: LocalSandbox,
    sock: socket.socket,
    *,
    max_body_bytes: int,
    max_queue: int,
    auth_token: str | None = None,
    limits: SandboxConfig | None = None,
    read_timeout_s: float = 30.0,
) -> str | None:
    """Run uvicorn on the bound `sock` (`tirl.sandbox.connections.bind`) in the foreground until SIGINT or SIGTERM;
    the pool is closed by the caller.

    Returns the name of the signal that stopped it (None: stopped otherwise).
    """
    import uvicorn

    if not log.handlers:  # the failed-run lines go to stderr next to uvicorn's own warnings
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
    app = create_app(
        sandbox, max_body_bytes=max_body_bytes, max_queue=max_queue, auth_token=auth_token, limits=limits
    )
    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        timeout_keep_alive=30,
        http=read_deadline_protocol(read_timeout_s),
        lifespan="off",  # no startup/shutdown hooks; a second Ctrl-C then forces the exit without a traceback
    )
    server = stoppable_server(config)
    server.run(sockets=[sock])
    return server.stopped_by
