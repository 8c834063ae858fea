"""Requests in flight against a weight sync: the gate a server engine's requests pass and its sync closes.

Streaming RL (`rl.stream.*`, `tirl.train.rl.stream`) keeps sampling while the trainer updates, so a sync can come while
requests are in flight. The sync must not reload weights under them (a turn would be sampled half by one policy and
half by the other without a record of where), so `exclusive()` closes the gate: new requests wait, and

- by default it waits for the requests in flight to end (each is one turn, at most `agent.max_tokens_per_turn`
  tokens);
- with `interrupt` on (partial rollouts, `rl.stream.partial`), it asks them to stop: a streaming request checks
  `interrupted()` after every chunk, closes its HTTP response (vLLM aborts a request whose client went away), keeps
  the tokens and log-probs it has, and re-enters the gate, which lets it through once the new weights are served, to
  go on from that prefix. Each token keeps the version that sampled it (`Generation.token_versions`).

A request that is waiting in the server's queue sees the interruption at its first chunk: the sync waits at most for
a prefill and one token per request. Not here: what the engine sends, or how it continues (its `generate`).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator


class RequestGate:
    """Counts requests in flight; `exclusive()` (one at a time: the trainer's sync) runs with none in flight."""

    def __init__(self, *, interrupt: bool = False) -> None:
        self.interrupt = interrupt  # partial rollouts: a sync interrupts requests instead of waiting for them
        self._cond = threading.Condition()
        self._in_flight = 0
        self._closed = False
        self.interruptions = 0  # requests interrupted so far (for tests and logs)

    @contextlib.contextmanager
    def request(self) -> Iterator[None]:
        """One request: waits while a sync runs."""
        with self._cond:
            while self._closed:
                self._cond.wait()
            self._in_flight += 1
        try:
            yield
        finally:
            with self._cond:
                self._in_flight -= 1
                self._cond.notify_all()

    def interrupted(self) -> bool:
        """A request in flight should stop now and keep what it has (a sync is waiting, partial rollouts on)."""
        return self.interrupt and self._closed

    def note_interruption(self) -> None:
        with self._cond:
            self.interruptions += 1

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def in_flight(self) -> int:
        return self._in_flight

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """A weight sync: new requests wait; those in flight end (or are interrupted) before the body runs."""
        with self._cond:
            self._closed = True
            try:
                while self._in_flight:
                    self._cond.wait()
            except BaseException:
                self._closed = False
                self._cond.notify_all()
                raise
        try:
            yield
        finally:
            with self._cond:
                self._closed = False
                self._cond.notify_all()
