"""Who may receive the trainer's weight stream (`rollout.vllm.sync=memory`): the gate in front of its listener.

Anyone who reaches the listener may connect, so a connection counts only once it has sent the sync's one-time token
(compared in constant time) and a nonce, which the gate answers with the key's proof (`stream_proof`: the receiver
loads nothing from a listener that cannot give it). Handshakes run side by side, each with its own short deadline,
and connections without the token are bounded, `Limits.most` in all and `most_per_source` from one address (the
fullest address makes room), so idle or slow strangers cannot use up the servers' window to connect. A flood of
connections cannot push a receiver out either: each connection keeps its place for `grace_s` (a receiver on a loaded
server may send its token a few hundred milliseconds after connecting), and while every held one is that young a
newcomer is closed at once instead; a receiver closed before the stream began connects again
(`tirl_weight_receiver.connect`).
"""

from __future__ import annotations

import hmac
import selectors
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tirl.rollout.engines.vllm.ext import tirl_weight_receiver as wire


@dataclass(frozen=True)
class Limits:
    """What the gate holds: connections in all and per source address, seconds to send the token, and the time a
    held connection keeps its place before it may be dropped to make room."""

    most: int
    most_per_source: int
    timeout_s: float
    grace_s: float


@dataclass
class _Pending:
    """A connection that has not sent the whole token: where from, when it was accepted, and its bytes so far."""

    source: str
    opened: float
    got: bytearray = field(default_factory=bytearray)


class Gate:
    """The listener and each connection that has not sent the token yet, watched by one selector (oldest first in
    `pending`, and per source address in `by_source`); `admitted` holds those that sent it, `dropped` counts the
    others."""

    def __init__(
        self, listener: socket.socket, secret: bytes, limits: Limits, proof: Callable[[bytes], bytes]
    ) -> None:
        self.listener, self.secret, self.limits, self.proof = listener, secret, limits, proof
        self.pending: dict[socket.socket, _Pending] = {}
        self.by_source: dict[str, dict[socket.socket, None]] = {}  # insertion order: oldest first
        self.admitted: list[socket.socket] = []
        self.dropped = 0
        self.sel = selectors.DefaultSelector()
        listener.setblocking(False)
        self.sel.register(listener, selectors.EVENT_READ)

    def settle(self, conn: socket.socket, ok: bool, got: bytes | bytearray = b"") -> None:
        """`conn` admitted (it sent the token, and `got`, its handshake, ends with its nonce: it gets the proof) or
        closed."""
        if (entry := self.pending.pop(conn, None)) is not None:
            self.sel.unregister(conn)
            held = self.by_source[entry.source]
            del held[conn]
            if not held:
                del self.by_source[entry.source]
        if ok:
            try:
                conn.setblocking(True)
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8 << 20)
                conn.sendall(self.proof(bytes(got[-wire.NONCE_BYTES :])))
            except OSError:  # gone before its proof: as if it had never sent the token
                ok = False
            else:
                self.admitted.append(conn)
        if not ok:
            conn.close()
            self.dropped += 1

    def poll(self, wait_s: float) -> None:
        """Drop the connections past their deadline, then take what arrived within `wait_s`: the held connections'
        bytes first (one that closed or sent its token frees its place), then the new connections."""
        now = time.monotonic()
        for conn in [c for c, p in self.pending.items() if p.opened + self.limits.timeout_s < now]:
            self.settle(conn, False)
        ready = [key.fileobj for key, _ in self.sel.select(timeout=wait_s)]
        for conn in ready:
            if conn is not self.listener and (entry := self.pending.get(conn)) is not None:
                if (ok := _handshake(conn, entry.got, self.secret)) is not None:
                    self.settle(conn, ok, entry.got)
        if self.listener in ready:
            self._take_new()

    def _take_new(self) -> None:
        for conn, addr in accept_ready(self.listener, self.limits.most):
            entry = _Pending(str(addr[0]), time.monotonic())
            if (ok := _handshake(conn, entry.got, self.secret)) is not None:  # a receiver sends it at once
                self.settle(conn, ok, entry.got)
            elif self._make_room(entry.source, entry.opened):
                self.pending[conn] = entry
                self.by_source.setdefault(entry.source, {})[conn] = None
                self.sel.register(conn, selectors.EVENT_READ)
            else:
                conn.close()
                self.dropped += 1

    def _make_room(self, source: str, now: float) -> bool:
        """Whether a new connection from `source` may be held, dropping the oldest of its own address (at that
        address's cap) or of the fullest one (at the cap in all) when that one has had `grace_s`. False: every
        candidate is younger, and the newcomer is the one closed, so a flood cannot push out a receiver that is
        about to send its token."""
        limits = self.limits
        if len(self.by_source.get(source, ())) >= limits.most_per_source:
            held = self.by_source[source]
        elif len(self.pending) >= limits.most:
            held = max(self.by_source.values(), key=len)
        else:
            return True
        oldest = next(iter(held))
        if self.pending[oldest].opened + limits.grace_s > now:
            return False
        self.settle(oldest, False)
        return True

    def close(self) -> None:
        for conn in list(self.pending):
            self.settle(conn, False)
        self.sel.close()


def accept_ready(sock: socket.socket, most: int) -> list[tuple[socket.socket, Any]]:
    """The connections waiting on non-blocking listener `sock` (at most `most`), non-blocking themselves, with
    their peers' addresses."""
    out: list[tuple[socket.socket, Any]] = []
    while len(out) < most:
        try:
            conn, addr = sock.accept()
        except OSError:  # none left (BlockingIOError), or one reset before it was accepted
            break
        conn.setblocking(False)
        out.append((conn, addr))
    return out


def _handshake(conn: socket.socket, got: bytearray, token: bytes) -> bool | None:
    """Read what `conn` has sent of its handshake (`u32 length | token | nonce`) into `got`: True once all of it is
    in and the token matches (compared in constant time), False for a wrong length or token (as soon as it is in) or
    a closed connection, None while incomplete. Never reads past the nonce."""
    want = wire.HEADER.size + len(token) + wire.NONCE_BYTES
    try:
        chunk = conn.recv(want - len(got))
    except (BlockingIOError, InterruptedError):
        return None
    except OSError:
        return False
    if not chunk:
        return False
    got += chunk
    if len(got) >= wire.HEADER.size and wire.HEADER.unpack_from(got)[0] != len(token):
        return False
    end = wire.HEADER.size + len(token)
    if len(got) >= end and not hmac.compare_digest(bytes(got[wire.HEADER.size : end]), token):
        return False  # a wrong token is dropped before its nonce
    return True if len(got) == want else None
