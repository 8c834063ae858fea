"""Inside a vLLM server: receive the trainer's weights over a socket and load them in place (`rollout.vllm.sync=memory`).

Started with `--worker-extension-cls tirl_weight_receiver.WeightReceiver` and this directory on PYTHONPATH, every
vLLM worker gains two methods the trainer calls through `POST /collective_rpc` (`VLLM_SERVER_DEV_MODE=1`):
- `tirl_receiver_info()`: the wire version and whether the server holds a key; the trainer's handshake (and how it
  counts the workers to expect);
- `tirl_receive_weights(host, port, token, timeout_s, mac)`: connect to the trainer, send the token and a fresh
  nonce (again on a new connection while the trainer closes it before the stream begins, as its gate does under a
  flood of strangers), check the trainer's proof, read tensors frame by frame and feed them, as they arrive, to the
  worker's own `reload_weights(weights_iterator=...)`: vLLM's in-place reload, the same one the directory path uses
  (stacked q/k/v, tensor parallel sharding, repacking after load), so both paths serve the same weights. Nothing is
  written to a file and the trainer never holds more than one tensor per frame.

Who may load weights: the key fixed when the server started (`$TIRL_VLLM_API_KEY`, which the trainer generates for
the server it starts). A call is refused unless `mac` is the key's HMAC of (host, port, token, timeout_s), so a
caller without the key can neither start a load nor point one at a listener of its own; a server started without a
key refuses every call. A server tirl starts is also pinned to its trainer's listener (`$TIRL_VLLM_SYNC_ADDR`,
`host:port`), and refuses any other. Before reading a frame the receiver checks that the listener knows the key: it
must answer the receiver's nonce with the key's HMAC of (token, nonce), which whoever else took the port cannot.

The wire: the receiver sends `u32 token length | token | 16-byte nonce`, the trainer answers with the 32-byte proof;
then per tensor a frame `u32 header length | JSON header | raw bytes`, the header `{"name", "dtype", "shape"}`; a
header `{"end": true}` closes the stream. Imports only the standard library and torch (vLLM's environment has both).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import socket
import struct
import time
from collections.abc import Iterator, Mapping

import torch

WIRE_VERSION = 2
KEY_ENV = "TIRL_VLLM_API_KEY"  # the server's key, fixed at its start (tirl_vllm_auth reads the same)
TARGET_ENV = "TIRL_VLLM_SYNC_ADDR"  # host:port, the only listener a server tirl starts takes weights from
NONCE_BYTES = 16
PROOF_BYTES = hashlib.sha256().digest_size
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
HEADER = struct.Struct("<I")
MAX_HEADER = 1 << 20  # a header larger than this is not ours


def recv_exact(sock: socket.socket, n: int) -> bytearray:
    """Exactly `n` bytes from `sock`, or ConnectionError if the trainer hung up first."""
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ConnectionError(f"the trainer closed the weight stream after {got} of {n} bytes")
        got += k
    return buf


def read_frames(sock: socket.socket) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) for every frame until the end frame; a malformed frame raises ValueError."""
    while True:
        (size,) = HEADER.unpack(recv_exact(sock, HEADER.size))
        if size > MAX_HEADER:
            raise ValueError(f"weight stream: a {size}-byte frame header; not a tirl trainer?")
        head = json.loads(recv_exact(sock, size))
        if head.get("end"):
            return
        dtype = DTYPES.get(head["dtype"])
        if dtype is None:
            raise ValueError(
                f"weight stream: {head['name']} has dtype {head['dtype']!r}; valid: {list(DTYPES)}"
            )
        shape = [int(d) for d in head["shape"]]
        nbytes = dtype.itemsize
        for d in shape:
            nbytes *= d
        data = recv_exact(sock, nbytes) if nbytes else bytearray()
        yield (
            head["name"],
            torch.frombuffer(data, dtype=dtype).reshape(shape) if nbytes else torch.empty(shape, dtype=dtype),
        )


def call_mac(key: str, host: str, port: int, token: str, timeout_s: float) -> str:
    """The key's HMAC of one `tirl_receive_weights` call: what the trainer signs and the receiver checks."""
    msg = json.dumps(["tirl_receive_weights", host, port, token, timeout_s]).encode()
    return hmac.new(key.encode(), msg, hashlib.sha256).hexdigest()


def stream_proof(key: str, token: str, nonce: bytes) -> bytes:
    """What the trainer's listener answers a receiver's nonce with: proof that it holds the key."""
    return hmac.new(
        key.encode(), b"tirl-weight-stream\0" + token.encode() + b"\0" + nonce, hashlib.sha256
    ).digest()


def check_call(
    host: object,
    port: object,
    token: object,
    timeout_s: object,
    mac: object,
    env: Mapping[str, str] = os.environ,
) -> str:
    """The server's key when the call may load weights (module docstring), else PermissionError (ValueError for
    arguments of the wrong type). Never names the key."""
    key = env.get(KEY_ENV, "")
    if not key:
        raise PermissionError(f"this vLLM server was started without ${KEY_ENV}: its weight receiver is off")
    if not (
        isinstance(host, str) and isinstance(token, str) and isinstance(mac, str)
        and type(port) is int and type(timeout_s) in (int, float) and timeout_s > 0
    ):  # fmt: skip
        raise ValueError("tirl_receive_weights(host: str, port: int, token: str, timeout_s > 0, mac: str)")
    want = call_mac(key, host, port, token, float(timeout_s))
    if not hmac.compare_digest(mac.encode(), want.encode()):
        raise PermissionError("tirl_receive_weights refused: the call is not signed with this server's key")
    pinned = env.get(TARGET_ENV, "")
    if pinned and pinned != f"{host}:{port}":
        raise PermissionError(
            f"tirl_receive_weights refused: this server takes weights only from {pinned} (${TARGET_ENV}), "
            f"not {host}:{port}"
        )
    return key


def open_stream(host: str, port: int, token: str, timeout_s: float) -> tuple[socket.socket, bytes]:
    """A connection to the trainer's weight stream that has sent the run's one-time token and a fresh nonce."""
    sock = socket.create_connection((host, int(port)), timeout=timeout_s)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    raw, nonce = token.encode(), os.urandom(NONCE_BYTES)
    sock.sendall(HEADER.pack(len(raw)) + raw + nonce)
    return sock, nonce


def connect(host: str, port: int, token: str, timeout_s: float, key: str) -> socket.socket:
    """`open_stream`, made again while the trainer closes the connection before its proof (its gate closes a
    newcomer while a flood of strangers holds every place), for up to `timeout_s`; returned once the listener has
    proved it holds `key`, else PermissionError. A trainer that gave up has closed its port: the refused connection
    ends this at once, as does a timeout."""
    deadline, wait = time.monotonic() + timeout_s, 0.02
    while True:
        sock = None
        try:
            sock, nonce = open_stream(host, port, token, timeout_s)
            proof = recv_exact(sock, PROOF_BYTES)
        except ConnectionRefusedError:
            raise
        except ConnectionError:  # reset or closed by the trainer's gate before the token was read
            proof = b""
        except BaseException:
            if sock is not None:
                sock.close()
            raise
        if proof:
            if hmac.compare_digest(proof, stream_proof(key, token, nonce)):
                return sock
            sock.close()
            raise PermissionError(
                f"the listener at {host}:{port} does not hold this server's key: not the trainer"
            )
        if sock is not None:
            sock.close()
        if time.monotonic() + wait > deadline:
            raise ConnectionError(
                f"the trainer at {host}:{port} closed every connection before the weight stream began, for "
                f"{timeout_s:g} s"
            )
        time.sleep(wait)
        wait = min(0.25, 2 * wait)


class WeightReceiver:
    """Mixed into vLLM's worker class by `--worker-extension-cls`; `self` is the worker."""

    def tirl_receiver_info(self) -> dict:
        return {"wire_version": WIRE_VERSION, "keyed": bool(os.environ.get(KEY_ENV))}

    def tirl_receive_weights(self, host: str, port: int, token: str, timeout_s: float, mac: str) -> int:
        """Load the trainer's streamed weights in place; returns how many tensors arrived."""
        key = check_call(host, port, token, timeout_s, mac)
        count = 0
        with connect(host, port, token, float(timeout_s), key) as sock:

            def counted() -> Iterator[tuple[str, torch.Tensor]]:
                nonlocal count
                for item in read_frames(sock):
                    count += 1
                    yield item

            self.reload_weights(weights_iterator=counted())
        return count
