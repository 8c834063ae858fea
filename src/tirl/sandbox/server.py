"""`tirl sandbox serve`: the warm pool behind SandboxFusion's HTTP API (FastAPI + uvicorn).

POST /run_code  SandboxFusion request/response (Python only; other languages get a 400 saying so)
GET  /health    pool size, idle workers, waiting runs
GET  /metrics   Prometheus text: runs by status, run latency histogram, queue depth, rejected requests, and per
                tier (light/heavy): idle and busy workers, recycled workers, runs routed there

Overload never hangs a client: beyond `workers + queue` runs in flight the server answers 429 at once, and a
request body over the size limit gets 413 (unread when Content-Length says so, else as soon as it passes the
limit). Every run that does not end `ok` is logged (logger `tirl.sandbox`, one line: status and reason).

The server's `sandbox.timeout_s` and `sandbox.memory_mb` are ceilings: a request's `run_timeout` and
`memory_limit_MB` can lower them, never raise them (a larger value is clamped, not refused, as SandboxFusion
clients send fixed values); a request without them gets the server's. The limits a run got come back in the
reply's `tirl.limits`. With a token (auth.py) every route needs `Authorization: Bearer <token>`.
"""

# No `from __future__ import annotations`: FastAPI must see the request model class defined in create_app.

import errno
import logging
import socket
import time
from typing import Any

from tirl.errors import TirlError
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


def ceilings(timeout_s: float | None, memory_mb: int, config: SandboxConfig) -> tuple[float, int]:
    """The limits one request runs under: what it asks for, at most the server's (none asked: the server's).

    SandboxFusion reads `memory_limit_MB` <= 0 as "no limit"; here that is the server's own limit.
    """
    timeout = config.timeout_s if timeout_s is None else min(timeout_s, config.timeout_s)
    memory = config.memory_mb if memory_mb <= 0 else min(memory_mb, config.memory_mb)
    return timeout, memory


def _request_model() -> type:
    """SandboxFusion's RunCodeRequest (Python's fields), built when the server starts (pydantic is imported lazily)."""
    from pydantic import BaseModel, ConfigDict, Field

    class RunCodeRequest(BaseModel):
        model_config = ConfigDict(extra="ignore")
        code: str
        language: str = "python"
        compile_timeout: float = 10.0  # accepted and unused: Python has no compile step (as in SandboxFusion)
        run_timeout: float | None = Field(default=None, gt=0)  # None: the server's sandbox.timeout_s
        memory_limit_MB: int = -1  # <= 0: the server's sandbox.memory_mb (SandboxFusion: no limit)
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
) -> Any:
    """The FastAPI app serving `sandbox`; at most workers + max_queue requests are admitted at once.

    `auth_token`: when set, every request must carry it as a bearer token (else 401).
    """
    from fastapi import FastAPI, HTTPException
    from fastapi.responses import PlainTextResponse

    RunCodeRequest = _request_model()
    metrics = Metrics()
    runner = _Runner(sandbox, metrics, max_queue)
    app = FastAPI(title="tirl sandbox", version="1")

    @app.post("/run_code")
    async def run_code(req: RunCodeRequest) -> dict:
        if req.language.lower() not in ("python", "python3"):
            metrics.rejected["bad_request"] += 1
            raise HTTPException(
                400, f"language {req.language!r} is not supported by tirl's sandbox: only 'python'"
            )
        files = {
            k: v for k, v in req.files.items() if "IGNORE_THIS_FILE" not in k
        }  # SandboxFusion skips these
        try:
            file_request(files, req.fetch_files)
        except ValueError as e:
            metrics.rejected["bad_request"] += 1
            raise HTTPException(400, str(e)) from None
        timeout, memory = ceilings(req.run_timeout, req.memory_limit_MB, sandbox.config)
        result = await runner.run(req.code, req.stdin, timeout, memory, files, req.fetch_files)
        reply = to_response(result)
        reply["tirl"]["limits"] = {"run_timeout": timeout, "memory_limit_MB": memory}
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


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound before anything says "serving"; a taken port is a one-line error."""
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as e:
        raise TirlError(f"--host {host!r} does not resolve to an address to bind: {e}") from None
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


def serve(
    sandbox: LocalSandbox,
    sock: socket.socket,
    *,
    max_body_bytes: int,
    max_queue: int,
    auth_token: str | None = None,
) -> None:
    """Run uvicorn on the bound `sock` in the foreground until interrupted; the pool is closed by the caller."""
    import uvicorn

    if not log.handlers:  # the failed-run lines go to stderr next to uvicorn's own warnings
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
    app = create_app(sandbox, max_body_bytes=max_body_bytes, max_queue=max_queue, auth_token=auth_token)
    config = uvicorn.Config(app, log_level="warning", access_log=False, timeout_keep_alive=30)
    uvicorn.Server(config).run(sockets=[sock])
