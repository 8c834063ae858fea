"""`tirl sandbox serve`: the warm pool behind SandboxFusion's HTTP API (FastAPI + uvicorn).

POST /run_code  SandboxFusion request/response (Python only; other languages get a 400 saying so)
GET  /health    pool size, idle workers, waiting runs
GET  /metrics   Prometheus text: runs by status, run latency histogram, queue depth, rejected requests, and per
                tier (light/heavy): idle and busy workers, recycled workers, runs routed there

Overload never hangs a client: beyond `workers + queue` runs in flight the server answers 429 at once, and a
request body over the size limit gets 413 (unread when Content-Length says so, else as soon as it passes the
limit). Every run that does not end `ok` is logged (logger `tirl.sandbox`, one line: status and reason).

Limits are a default and a ceiling: a request without `run_timeout` / `memory_limit_MB` gets `sandbox.timeout_s` /
`sandbox.memory_mb`; one that asks gets what it asks for, up to `sandbox.max_timeout_s` / `sandbox.max_memory_mb`
(a larger value is clamped, not refused, as SandboxFusion clients send fixed values). The limits a run got, and
which were clamped, come back in the reply's `tirl.limits`. With a token (auth.py) every route needs
`Authorization: Bearer <token>`.

A connection must deliver a complete request (headers and body) within `read_timeout_s` of its opening or of the
previous response, else it is closed: idle and stalled connections cannot pile up. SIGTERM and SIGINT stop the
server the same way: no new connections, running requests finish, then the caller closes the pool.
"""

# No `from __future__ import annotations`: FastAPI must see the request model class defined in create_app.

import asyncio
import contextlib
import errno
import logging
import math
import signal
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

from tirl.core.errors import TirlError
from tirl.sandbox.auth import BearerAuth
from tirl.sandbox.config import SandboxConfig
from tirl.sandbox.fusion import to_response
from tirl.sandbox.local import LocalSandbox, SandboxOverloaded, file_request
from tirl.sandbox.types import ExecResult

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
STATUSES = ("ok", "runtime_error", "timeout", "memory_exceeded", "output_truncated", "sandbox_error")
TIERS = ("light", "heavy")
log = logging.getLogger("tirl.sandbox")


def failure_reason(r: ExecResult, timeout_s: float) -> str:
    """One line saying why a run did not end ok (for the server's log)."""
    if r.sandbox_error is not None:
        return r.sandbox_error
    if r.status == "timeout":
        return f"killed after {timeout_s:g} s wall clock" if r.timed_out else "CPU time limit (SIGXCPU)"
    if r.status == "output_truncated":
        return "output over the per-stream cap; run killed"
    if r.status == "memory_exceeded" and r.memory_exceeded:
        return "killed by the memory cgroup's OOM killer"
    last = next((line for line in reversed(r.stderr.splitlines()) if line.strip()), "")
    return f"exit code {r.exit_code}: {last[:200]}" if last else f"exit code {r.exit_code}"


class Metrics:
    """Counters and a latency histogram, rendered in the Prometheus text format (updated on the event loop)."""

    def __init__(self) -> None:
        self.runs = dict.fromkeys(STATUSES, 0)
        self.buckets = [0] * len(LATENCY_BUCKETS)
        self.latency_sum = 0.0
        self.latency_count = 0
        self.rejected = {"overloaded": 0, "too_large": 0, "bad_request": 0, "unauthorized": 0}

    def observe(self, status: str, seconds: float) -> None:
        self.runs[status] += 1
        self.latency_sum += seconds
        self.latency_count += 1
        for i, le in enumerate(LATENCY_BUCKETS):
            if seconds <= le:
                self.buckets[i] += 1

    def render(self, stats: dict[str, int], inflight: int) -> str:
        def block(name: str, kind: str, help_: str, samples: list[tuple[str, float]]) -> list[str]:
            return [f"# HELP {name} {help_}", f"# TYPE {name} {kind}"] + [
                f"{name}{k} {v}" for k, v in samples
            ]

        runs = [(f'{{status="{s}"}}', n) for s, n in self.runs.items()]
        hist = [(f'_bucket{{le="{le}"}}', n) for le, n in zip(LATENCY_BUCKETS, self.buckets, strict=True)]
        hist += [('_bucket{le="+Inf"}', self.latency_count), ("_sum", self.latency_sum)]
        hist += [("_count", self.latency_count)]
        rejected = [(f'{{reason="{r}"}}', n) for r, n in self.rejected.items()]
        lines = block("tirl_sandbox_runs_total", "counter", "Runs finished, by result status.", runs)
        lines += block(
            "tirl_sandbox_run_seconds", "histogram", "Run latency at the server, queueing included.", hist
        )
        lines += block("tirl_sandbox_rejected_total", "counter", "Requests refused before running.", rejected)
        for name, value, help_ in (
            ("queue_depth", stats["waiting"], "Runs waiting for a free worker."),
            ("inflight", inflight, "Requests being run or waiting."),
            ("workers", stats["workers"], "Warm workers in the pool."),
            ("idle_workers", stats["idle"], "Workers ready for a run."),
        ):
            lines += block(f"tirl_sandbox_{name}", "gauge", help_, [("", value)])
        for name, kind, key, help_ in (
            ("tier_idle_workers", "gauge", "idle", "Started workers of the tier waiting for a run."),
            ("tier_busy_workers", "gauge", "busy", "Started workers of the tier running a snippet."),
            (
                "tier_recycles_total",
                "counter",
                "recycles",
                "Workers of the tier replaced (kill, crash, max runs).",
            ),
            ("tier_routed_total", "counter", "runs", "Runs the router sent to the tier."),
        ):
            samples = [(f'{{tier="{t}"}}', stats[f"{t}_{key}"]) for t in TIERS]
            lines += block(f"tirl_sandbox_{name}", kind, help_, samples)
        return "\n".join(lines) + "\n"


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


def limits_for(timeout_s: float | None, memory_mb: int, config: SandboxConfig) -> dict[str, Any]:
    """The limits one request runs under: what it asks for up to the ceilings (`max_*`), else the defaults.

    SandboxFusion reads `memory_limit_MB` <= 0 as "no limit"; here that is the server's default. `clamped` names
    the fields a request asked above the ceiling for.
    """
    timeout = config.timeout_s if timeout_s is None else min(timeout_s, config.max_timeout_s)
    memory = config.memory_mb if memory_mb <= 0 else min(memory_mb, config.max_memory_mb)
    clamped = [
        k
        for k, asked, got in (("run_timeout", timeout_s, timeout), ("memory_limit_MB", memory_mb, memory))
        if asked is not None and asked > 0 and asked != got
    ]
    return {"run_timeout": timeout, "memory_limit_MB": memory, "clamped": clamped}


def _request_model() -> type:
    """SandboxFusion's RunCodeRequest (Python's fields), built when the server starts (pydantic is imported lazily)."""
    from pydantic import BaseModel, ConfigDict, Field

    class RunCodeRequest(BaseModel):
        model_config = ConfigDict(extra="ignore")
        code: str
        language: str = "python"
        compile_timeout: float = 10.0  # accepted and unused: Python has no compile step (as in SandboxFusion)
        # None: sandbox.timeout_s; <= max_timeout_s. NaN and inf are refused (Python's JSON reads them)
        run_timeout: float | None = Field(default=None, gt=0, allow_inf_nan=False)
        memory_limit_MB: int = -1  # <= 0: sandbox.memory_mb (SandboxFusion: no limit); <= max_memory_mb
        stdin: str | None = None
        files: dict[str, str | None] = Field(default_factory=dict)
        fetch_files: list[str] = Field(default_factory=list)

    return RunCodeRequest


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

    RunCodeRequest = _request_model()
    metrics = Metrics()
    runner = _Runner(sandbox, metrics, max_queue)
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
        files = _checked_request(req, metrics)
        got = limits_for(req.run_timeout, req.memory_limit_MB, limits)
        timeout, memory = got["run_timeout"], got["memory_limit_MB"]
        result = await runner.run(req.code, req.stdin, timeout, memory, files, req.fetch_files)
        reply = to_response(result)
        reply["tirl"]["limits"] = got
        return reply

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "inflight": runner.inflight, **sandbox.stats()}

    @app.get("/metrics", response_class=PlainTextResponse)
    async def prometheus() -> str:
        return metrics.render(sandbox.stats(), runner.inflight)

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


def _checked_request(req: Any, metrics: Metrics) -> dict[str, str | None]:
    """The request's `files` to write (SandboxFusion skips those named IGNORE_THIS_FILE), or HTTP 400 naming
    what is wrong: a language other than Python, or a bad `files`/`fetch_files` path or content."""
    from fastapi import HTTPException

    if req.language.lower() not in ("python", "python3"):
        metrics.rejected["bad_request"] += 1
        raise HTTPException(
            400, f"language {req.language!r} is not supported by tirl's sandbox: only 'python'"
        )
    files = {k: v for k, v in req.files.items() if "IGNORE_THIS_FILE" not in k}  # SandboxFusion skips these
    try:
        file_request(files, req.fetch_files)
    except ValueError as e:
        metrics.rejected["bad_request"] += 1
        raise HTTPException(400, str(e)) from None
    return files


class _Runner:
    """Admission (429 beyond workers + queue) and the run itself on a worker thread, with metrics and the log line."""

    def __init__(self, sandbox: LocalSandbox, metrics: Metrics, max_queue: int) -> None:
        import anyio

        self.sandbox, self.metrics = sandbox, metrics
        self.capacity = sandbox.workers + max_queue
        self.limiter = anyio.CapacityLimiter(self.capacity)
        self.inflight = 0

    async def run(
        self, code: str, stdin: str | None, timeout: float, memory: int, files: dict, fetch: list[str]
    ) -> ExecResult:
        import anyio
        from fastapi import HTTPException

        if self.inflight >= self.capacity:
            self.metrics.rejected["overloaded"] += 1
            raise HTTPException(
                429, f"overloaded: {self.capacity} runs in flight", headers={"Retry-After": "1"}
            )
        self.inflight += 1
        t0 = time.monotonic()
        try:
            result = await anyio.to_thread.run_sync(
                lambda: self.sandbox.run(
                    code, stdin=stdin, timeout_s=timeout, memory_mb=memory, files=files, fetch_files=fetch
                ),
                limiter=self.limiter,
            )
        except SandboxOverloaded as e:
            self.metrics.rejected["overloaded"] += 1
            raise HTTPException(429, f"overloaded: {e}", headers={"Retry-After": "1"}) from None
        except RuntimeError as e:  # the pool is closed: shutting down
            raise HTTPException(503, f"sandbox unavailable: {e}") from None
        finally:
            self.inflight -= 1
        self.metrics.observe(result.status, time.monotonic() - t0)
        if result.status != "ok":
            reason = failure_reason(result, timeout)
            log.warning("run failed: status=%s reason=%s wall=%.3fs", result.status, reason, result.wall_time)
        return result


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


def _stoppable_server(config: Any) -> Any:
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
    """Run uvicorn on the bound `sock` in the foreground until SIGINT or SIGTERM; the pool is closed by the caller.

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
    server = _stoppable_server(config)
    server.run(sockets=[sock])
    return server.stopped_by
