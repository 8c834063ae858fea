"""Inside a vLLM server: receive the trainer's weights over a socket and load them in place (`rollout.vllm.sync=memory`).

Started with `--worker-extension-cls tirl_weight_receiver.WeightReceiver` and this directory on PYTHONPATH, every
vLLM worker gains two methods the trainer calls through `POST /collective_rpc` (`VLLM_SERVER_DEV_MODE=1`):
- `tirl_receiver_info()`: the wire version; the trainer's handshake (and how it counts the workers to expect);
- `tirl_receive_weights(host, port, token, timeout_s)`: connect to the trainer, send the token (again on a new
  connection while the trainer closes it before the stream begins, as its gate does under a flood of strangers),
  read tensors frame by frame and feed them, as they arrive, to the worker's own
  `reload_weights(weights_iterator=...)`: vLLM's in-place reload, the same one the directory path uses (stacked
  q/k/v, tensor parallel sharding, repacking after load), so both paths serve the same weights. Nothing is written
  to a file and the trainer never holds more than one tensor per frame.

The wire: per tensor a frame `u32 header length | JSON header | raw bytes`, the header `{"name", "dtype", "shape"}`;
a header `{"end": true}` closes the stream. Imports only the standard library and torch (vLLM's environment has both).
"""

from __future__ import annotations

import json
import socket
import struct
import time
from collections.abc import Iterator

import torch

WIRE_VERSION = 1
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


def open_stream(host: str, port: int, token: str, timeout_s: float) -> socket.socket:
    """A connection to the trainer's weight stream, authenticated by the run's one-time token."""
    sock = socket.create_connection((host, int(port)), timeout=timeout_s)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    raw = token.encode()
    sock.sendall(HEADER.pack(len(raw)) + raw)
    return sock


def connect(host: str, port: int, token: str, timeout_s: float) -> socket.socket:
    """`open_stream`, made again while the trainer closes the connection before the stream's first byte (its gate
    closes a newcomer while a flood of strangers holds every place), for up to `timeout_s`. A trainer that gave up
    has closed its port: the refused connection ends this at once, as does a timeout."""
    deadline, wait = time.monotonic() + timeout_s, 0.02
    while True:
        sock = None
        try:
            sock = open_stream(host, port, token, timeout_s)
            if sock.recv(1, socket.MSG_PEEK):  # the first frame: admitted, the stream has begun
                return sock
        except (ConnectionResetError, BrokenPipeError):
            pass  # closed by the trainer's gate before the token was read
        except BaseException:
            if sock is not None:
                sock.close()
            raise
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
        return {"wire_version": WIRE_VERSION}

    def tirl_receive_weights(self, host: str, port: int, token: str, timeout_s: float) -> int:
        """Load the trainer's streamed weights in place; returns how many tensors arrived."""
        count = 0
        with connect(host, port, token, timeout_s) as sock:

            def counted() -> Iterator[tuple[str, torch.Tensor]]:
                nonlocal count
                for item in read_frames(sock):
                    count += 1
                    yield item

            self.reload_weights(weights_iterator=counted())
        return count
