"""`SandboxClient`: the sandbox contract (run, run_batch, close) over HTTP, against tirl or SandboxFusion servers.

URLs are used round-robin; one pooled httpx client keeps connections alive; at most `max_workers` requests are
in flight (32 when 0); timeouts, connection errors, 5xx and 429 are retried on the next URL with exponential
back-off (`retries` times). A run that still fails comes back as a sandbox_error result: `run` never raises on
a sick server, so one bad node costs retries, not a crashed rollout. Every request carries the bearer token
of `sandbox.auth_token_file` (or $TIRL_SANDBOX_TOKEN) when one is set.

A reply is read up to `max_reply_bytes`, what a reply of two streams at `sandbox.max_output_bytes` can take (each
byte escaped in JSON) and no more: a server with a larger cap, or none, cannot grow the client's memory with a
flood of output. A longer reply is not read on; its run comes back flagged `output_truncated`, with a sandbox_error
saying the reply was too large.
"""

from __future__ import annotations

import itertools
import json
import math
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import httpx

from tirl.sandbox.auth import load_token
from tirl.sandbox.config import SandboxConfig
from tirl.sandbox.fusion import from_response, request_body
from tirl.sandbox.types import ExecResult, batch_stdins

_BACKOFF_S = 0.05
_BACKOFF_MAX_S = 2.0
_JSON_BYTES_PER_BYTE = 6  # the most a byte of output takes in a JSON reply (a control byte: \u0001)
_REPLY_ENVELOPE_BYTES = 64 * 2**10  # a reply's fields besides stdout and stderr (status, tirl's extension)


class _TooLarge(Exception):
    """The reply went past `max_reply_bytes`; it was not read on."""


class SandboxClient:
    def __init__(self, config: SandboxConfig, *, transport: httpx.BaseTransport | None = None) -> None:
        """`transport` replaces the network (tests use httpx.MockTransport)."""
        if not config.urls:
            raise ValueError("SandboxClient needs sandbox.urls (one or more http://host:port)")
        self.config = config
        self.concurrency = config.max_workers or 32
        self.max_reply_bytes = 2 * _JSON_BYTES_PER_BYTE * config.max_output_bytes + _REPLY_ENVELOPE_BYTES
        self._urls = itertools.cycle([u.rstrip("/") + "/run_code" for u in config.urls])
        self._url_lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(self.concurrency)
        limits = httpx.Limits(max_connections=self.concurrency, max_keepalive_connections=self.concurrency)
        headers = {"Accept": "application/json"}
        token = load_token(config.auth_token_file or None)  # the file, else $TIRL_SANDBOX_TOKEN, else none
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        self._http = httpx.Client(limits=limits, headers=headers, transport=transport)
        self._pool: ThreadPoolExecutor | None = None
        self._closed = False

    def _next_url(self) -> str:
        with self._url_lock:
            return next(self._urls)

    def run(self, code: str, *, stdin: str | None = None, timeout_s: float | None = None) -> ExecResult:
        timeout = self.config.timeout_s if timeout_s is None else timeout_s
        if not 0 < timeout < math.inf:  # NaN and inf too: the request's JSON has no place for them
            raise ValueError(f"timeout_s must be > 0 and finite, got {timeout}")
        if self._closed:
            raise RuntimeError("SandboxClient is closed")
        # Lone surrogates (JSON data may hold "\\ud800") cannot go out as UTF-8: replace them, as the local pool does.
        code = code.encode("utf-8", errors="replace").decode("utf-8")
        if stdin is not None:
            stdin = stdin.encode("utf-8", errors="replace").decode("utf-8")
        body = request_body(code, stdin=stdin, timeout_s=timeout)
        http_timeout = timeout + self.config.request_timeout_s
        start = time.monotonic()
        error = ""
        with self._slots:
            for attempt in range(self.config.retries + 1):
                if attempt:
                    time.sleep(min(_BACKOFF_MAX_S, _BACKOFF_S * 2 ** (attempt - 1)))
                url = self._next_url()
                try:
                    status, data = self._post(url, body, http_timeout)
                except httpx.TransportError as e:  # timeouts, refused connections, resets
                    error = f"{url}: {type(e).__name__}: {e}"
                    continue
                except _TooLarge:  # the snippet's output, most likely: another server would send as much
                    msg = (
                        f"remote sandbox reply too large: {url} sent over {self.max_reply_bytes} bytes, the most "
                        "two streams of sandbox.max_output_bytes can take in JSON; not read on"
                    )
                    return ExecResult("", "", None, False, True, time.monotonic() - start, msg)
                text = data[:500].decode("utf-8", errors="replace")
                if status == 429 or status >= 500:
                    error = f"{url}: HTTP {status}: {text[:200]}"
                    continue
                if status != 200:  # our request is wrong: retrying cannot help
                    error = f"{url}: HTTP {status}: {text}"
                    break
                try:
                    payload = json.loads(data)
                except ValueError:
                    error = f"{url}: response is not JSON: {text[:200]!r}"
                    continue
                return from_response(payload, wall_time=time.monotonic() - start)
        wall = time.monotonic() - start
        return ExecResult("", "", None, False, False, wall, f"remote sandbox failed: {error}")

    def _post(self, url: str, body: dict, timeout_s: float) -> tuple[int, bytes]:
        """POST `body`; the status and the reply, read as it arrives, or _TooLarge past `max_reply_bytes` (the
        connection is then closed, not read to its end)."""
        with self._http.stream("POST", url, json=body, timeout=timeout_s) as resp:
            data = bytearray()
            for chunk in resp.iter_bytes():
                data += chunk
                if len(data) > self.max_reply_bytes:
                    raise _TooLarge
            return resp.status_code, bytes(data)

    def run_batch(
        self,
        codes: Sequence[str],
        *,
        stdins: Sequence[str | None] | None = None,
        timeout_s: float | None = None,
    ) -> list[ExecResult]:
        """Send the snippets concurrently (up to the concurrency limit); results in input order."""
        inputs = batch_stdins(codes, stdins)
        if self._closed:
            raise RuntimeError("SandboxClient is closed")
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="tirl-sandbox-client")
        return list(self._pool.map(lambda c, s: self.run(c, stdin=s, timeout_s=timeout_s), codes, inputs))

    def close(self) -> None:
        self._closed = True
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        self._http.close()

    def __enter__(self) -> SandboxClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
