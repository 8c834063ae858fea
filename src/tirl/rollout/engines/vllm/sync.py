"""Weights into vLLM servers in memory (`rollout.vllm.sync=memory`): streamed over a socket, never through a file.

The trainer opens a listener (under torchrun every rank, for its share of the servers: `pool.sync_share`), asks
each server (`POST /collective_rpc`, in a thread per server) to connect back and load what arrives
(`vllm_ext/tirl_weight_receiver.py`, the worker extension every managed server is started with), and writes the
policy to every connection one tensor at a time as the tensors are gathered. vLLM loads them with its own in-place
reload, the one the directory path uses, so both paths serve the same weights
(a test compares the served log-probs). Memory: one full tensor at a time on each rank, and none on disk.

`rollout.vllm.sync=auto` (the default) takes this path when every server has the receiver and the directory reload
(`tirl.rollout.engines.vllm.pool.write_streamed`, `tirl.rollout.engines.vllm.weights`) otherwise: a server someone else started
without `--worker-extension-cls tirl_weight_receiver.WeightReceiver` still syncs. The stream needs the servers to
reach the trainer (`rollout.vllm.sync_host`, 127.0.0.1 by default); the directory path needs a shared file system.

Who may load the weights: each server holds a key fixed when it started (`$TIRL_VLLM_API_KEY`; tirl generates one
for the server it starts, a server reached by `rollout.urls` gets the one in the trainer's environment). The trainer
signs every `tirl_receive_weights` call with it (an HMAC of the listener's address and the sync's one-time token),
the receiver refuses an unsigned call, and it loads only from a listener that proves it holds the key
(`tirl_weight_receiver`). A server tirl starts also takes weights only from the listener this trainer opened before
starting it (`WeightStream`, on a port it keeps for the run). Who may receive them: a connection to the listener
counts once it has sent the sync's token (`tirl.rollout.engines.vllm.stream_gate`, which also bounds the strangers).

On GPUs the tensors cross the host here too (device -> host -> socket -> device): a correct path, not the fastest.
NCCL between trainer and servers (vLLM's weight-transfer engines) is the GPU's fast path and is not built.
"""

from __future__ import annotations

import contextlib
import json
import resource
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from tirl.models.loading import tied_aliases
from tirl.rollout.engines.vllm.ext import tirl_vllm_auth as auth
from tirl.rollout.engines.vllm.ext import tirl_weight_receiver as wire
from tirl.rollout.engines.vllm.stream_gate import Gate, Limits
from tirl.rollout.engines.vllm.weights import EMBED_SUFFIX, LM_HEAD

RECEIVER_CLS = "tirl_weight_receiver.WeightReceiver"
AUTH_MIDDLEWARE = "tirl_vllm_auth.RequireKey"
RECEIVER_DIR = str(Path(wire.__file__).parent)
WIRE_NAMES = {v: k for k, v in wire.DTYPES.items()}


def receiver_args() -> list[str]:
    """The server arguments that give every vLLM worker the receiver (with `RECEIVER_DIR` on its PYTHONPATH)."""
    return ["--worker-extension-cls", RECEIVER_CLS]


def auth_args() -> list[str]:
    """The server arguments that make every route require the key (`tirl_vllm_auth`, from `RECEIVER_DIR`)."""
    return ["--middleware", AUTH_MIDDLEWARE]


def full_tensors(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, whole tensor on the CPU) for every weight, one at a time, in the same order on every rank; a sharded
    weight (DTensor) is all-gathered, so under FSDP this is a collective every rank must run to the end."""
    aliases = tied_aliases(model)
    for name, t in model.state_dict().items():
        if name not in aliases:
            yield name, _whole(t)


def policy_tensors(
    model: torch.nn.Module, *, untie: bool, dtype: str = ""
) -> Iterator[tuple[str, torch.Tensor]]:
    """What a server loads: the weights under the plain model's names (a LoRA adapter folded in), and the input
    embedding a second time as `lm_head.weight` when the server serves a tied model untied (`weights`).
    `dtype`: the served dtype; floating tensors are cast to it one at a time as they are gathered, so fp32 master
    weights served in bf16 cross the wire at half the bytes (vLLM would round them the same way on load; "" or an
    unknown name such as "auto": as trained). Under FSDP a collective, as `full_tensors` (a sharded LoRA model
    merges shard-wise, then gathers each tensor)."""
    from tirl.models.lora import is_lora, merged_state_dict

    items: Iterable[tuple[str, torch.Tensor]]
    if is_lora(model):
        aliases = tied_aliases(model.get_base_model())
        items = ((n, _whole(t)) for n, t in merged_state_dict(model).items() if n not in aliases)
    else:
        items = full_tensors(model)
    served = wire.DTYPES.get(dtype)
    for name, t in items:
        if served is not None and t.is_floating_point() and t.dtype != served:
            t = t.to(served)
        yield name, t
        if untie and name.endswith(EMBED_SUFFIX):
            yield LM_HEAD, t


def _whole(t: torch.Tensor) -> torch.Tensor:
    """`t` whole on the CPU (an FSDP2 shard all-gathered)."""
    from torch.distributed.tensor import DTensor

    if isinstance(t, DTensor):
        t = t.full_tensor()
    return t.detach().to("cpu").contiguous()


def frame(name: str, t: torch.Tensor) -> tuple[bytes, memoryview]:
    """One tensor's frame on the wire: the header bytes, then a view of its raw data (no copy)."""
    if t.dtype not in WIRE_NAMES:
        raise TypeError(f"{name}: dtype {t.dtype} cannot be streamed; valid: {sorted(wire.DTYPES)}")
    head = json.dumps({"name": name, "dtype": WIRE_NAMES[t.dtype], "shape": list(t.shape)}).encode()
    data = t.contiguous().reshape(-1).view(torch.uint8).numpy()
    return wire.HEADER.pack(len(head)) + head, memoryview(data)


def end_frame() -> bytes:
    head = json.dumps({"end": True}).encode()
    return wire.HEADER.pack(len(head)) + head


@dataclass
class StreamResult:
    """What one streamed sync did: tensors and bytes sent, seconds, and the first failure ("" when none)."""

    tensors: int = 0
    bytes: int = 0
    seconds: float = 0.0
    error: str = ""
    loaded: list[Any] = field(default_factory=list)


HANDSHAKE_TIMEOUT_S = 10.0  # a connection that has not sent the whole token by then is dropped
MAX_PENDING = 512  # connections without the token held at once, at most a quarter of the fd limit
MAX_PENDING_PER_SOURCE = 128  # of those, from one address: a flood from one host leaves room for the others
GRACE_S = 1.0  # a held connection is never dropped to make room before this (a late token still arrives)
LISTEN_BACKLOG = 1024  # connections the kernel queues for accept() while a flood keeps the gate busy
# a receiver gives up when no byte arrives for this long (a trainer that died mid-stream)
RECV_TIMEOUT_S = 300.0
Post = Callable[[str, dict[str, Any], float], Any]  # (url, collective_rpc body, timeout_s) -> decoded JSON


class WeightStream:
    """A trainer process's listener for `rollout.vllm.sync=memory` (module docstring); one per engine, reused for every sync,
    on one port for its whole life. `key`: the servers' key, which signs every load."""

    def __init__(self, host: str = "127.0.0.1", *, key: str, accept_timeout_s: float = 120.0,
                 handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S, max_pending: int = MAX_PENDING,
                 max_pending_per_source: int = MAX_PENDING_PER_SOURCE, grace_s: float = GRACE_S) -> None:  # fmt: skip
        if not key:
            raise ValueError("WeightStream: the servers' key is empty")
        self.host, self.key, self.accept_timeout_s = host, key, accept_timeout_s
        self.handshake_timeout_s, self.grace_s = handshake_timeout_s, grace_s
        if (
            min(accept_timeout_s, handshake_timeout_s) <= 0
            or grace_s < 0
            or min(max_pending, max_pending_per_source) < 1
        ):
            raise ValueError(
                "WeightStream: accept_timeout_s > 0, handshake_timeout_s > 0, grace_s >= 0, max_pending >= 1 and "
                "max_pending_per_source >= 1"
            )
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if soft != resource.RLIM_INFINITY:  # held connections must leave the trainer its descriptors (EMFILE)
            max_pending = min(max_pending, max(1, soft // 4))
        self.max_pending, self.max_pending_per_source = max_pending, min(max_pending_per_source, max_pending)
        self._sock: socket.socket | None = socket.create_server((host, 0), backlog=LISTEN_BACKLOG)
        self.port = self._sock.getsockname()[1]

    @property
    def address(self) -> str:
        """`host:port`, what a server tirl starts is pinned to (`tirl_weight_receiver.TARGET_ENV`)."""
        return f"{self.host}:{self.port}"

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()

    def _reopen(self) -> None:
        """The listener closed and opened again on the same port: the connections still queued get a reset."""
        assert self._sock is not None
        self._sock.close()
        try:
            self._sock = socket.create_server((self.host, self.port), backlog=LISTEN_BACKLOG)
        except OSError:
            self._sock = None  # taken in between: every later sync says so

    def _proof(self, token: str) -> Callable[[bytes], bytes]:
        return lambda nonce: wire.stream_proof(self.key, token, nonce)

    def push(self, tensors: Iterable[tuple[str, torch.Tensor]], urls: list[str], workers: int, post: Post,
             rpc_timeout_s: float) -> StreamResult:  # fmt: skip
        """Stream `tensors` into every server at `urls` (`workers` receivers in all). `tensors` is always run to
        its end, even after a failure, because under FSDP every rank's gathers must complete."""
        token = secrets.token_hex(16)
        res, t0 = StreamResult(), time.monotonic()
        if self._sock is None:
            res.error = (
                f"the weight stream's port {self.address} was taken by another process; restart the run"
            )
            return res
        args = [self.host, self.port, token, float(RECV_TIMEOUT_S)]
        body = {"method": "tirl_receive_weights", "args": [*args, wire.call_mac(self.key, *args)]}
        calls = [_Call(post, u, body, rpc_timeout_s) for u in urls]
        conns = self._accept(self._sock, workers, token, calls, res)
        for name, t in tensors:
            if res.error:
                continue
            try:
                head, data = frame(name, t)
                for c in conns:
                    c.sendall(head)
                    c.sendall(data)
            except (OSError, TypeError) as e:
                res.error = f"the weight stream to a vLLM worker broke at {name}: {e}"
                continue
            res.tensors, res.bytes = res.tensors + 1, res.bytes + len(data)
        for c in conns:
            with contextlib.suppress(OSError):
                if not res.error:
                    c.sendall(end_frame())
                c.close()
        if res.error:  # receivers still connecting or waiting get a reset, so their RPCs end now
            self._reopen()
        for call in calls:
            call.join(timeout=None if not res.error else 30.0)
            res.error = res.error or call.error
            res.loaded.append(call.result)
        res.seconds = time.monotonic() - t0
        return res

    def _accept(self, sock: socket.socket, workers: int, token: str, calls: list[_Call],
                res: StreamResult) -> list[socket.socket]:  # fmt: skip
        """The receivers' connections. Every handshake runs side by side with the others (`Gate`), with its own
        `handshake_timeout_s`: a stranger that sends nothing, too little or a wrong token is dropped and delays no
        one else."""
        limits = Limits(self.max_pending, self.max_pending_per_source, self.handshake_timeout_s, self.grace_s)
        gate = Gate(sock, token.encode(), limits, self._proof(token))
        deadline = time.monotonic() + self.accept_timeout_s
        try:
            while len(gate.admitted) < workers:
                if failed := next((c.error for c in calls if c.error), ""):
                    res.error = failed
                    break
                if time.monotonic() > deadline:
                    res.error = (
                        f"{len(gate.admitted)} of {workers} vLLM workers connected to the weight stream at "
                        f"{self.host}:{self.port} within {self.accept_timeout_s:g} s ({gate.dropped} other "
                        "connections sent no valid token; can the servers reach rollout.vllm.sync_host?)"
                    )
                    break
                gate.poll(0.2)
        finally:
            gate.close()
        if res.error:
            for c in gate.admitted:
                c.close()
            return []
        return gate.admitted


class _Call(threading.Thread):
    """One server's `tirl_receive_weights` RPC (`body`, signed), running while the stream is written."""

    def __init__(self, post: Post, url: str, body: dict[str, Any], timeout_s: float) -> None:
        super().__init__(daemon=True, name=f"tirl-weight-rpc-{url}")
        self.post, self.url, self.body, self.timeout_s = post, url, body, timeout_s
        self.error, self.result = "", None
        self.start()

    def run(self) -> None:
        try:
            self.result = self.post(self.url, self.body, self.timeout_s)
        except Exception as e:
            self.error = f"{self.url}: loading the streamed weights failed: {e}"


def receiver_workers(post: Post, url: str) -> int:
    """How many vLLM workers at `url` carry the receiver and a key (0: none; the server lacks the worker extension,
    its key, or refuses the trainer's)."""
    try:
        out = post(url, {"method": "tirl_receiver_info"}, 30.0)
    except Exception:
        return 0
    results = out.get("results", []) if isinstance(out, dict) else []
    return sum(
        1
        for r in results
        if isinstance(r, dict) and r.get("wire_version") == wire.WIRE_VERSION and r.get("keyed")
    )


SYNC_RPC_TIMEOUT_S = 3600.0  # one streamed load; a dead server ends it at once (its connection drops)


class ServerSync:
    """Mixed into the vLLM engines (`VLLMEngine`, `VLLMPool`): how their `sync_weights` reaches the servers.

    Expects `self.vcfg` (`sync`, `sync_host`), `self.untied`, `self._client` (httpx) and `self._request`; `use_key`
    gives it the servers' key."""

    vcfg: Any
    untied: bool
    _client: Any
    api_key: str = ""
    _sync_mode: str = ""
    _stream: WeightStream | None = None
    _counts: dict[str, int] = {}  # noqa: RUF012 (replaced, never mutated): receiver workers per server URL
    last_sync: StreamResult | None = None

    def use_key(self, key: str) -> None:
        """Every request to the servers carries `key` (`Authorization: Bearer`, `tirl_vllm_auth`), and it signs the
        weight loads; "" = none (servers without a key: no in-memory sync)."""
        self.api_key = key
        if key:
            self._client.headers["Authorization"] = auth.bearer(key).decode()

    def _post_rpc(self, url: str, body: dict[str, Any], timeout_s: float) -> Any:
        """`POST /collective_rpc` once, without retries: a retried load would wait for a stream already spent."""
        from tirl.rollout.engines.openai.engine import EngineError

        r = self._client.post(f"{url}/collective_rpc", json=body, timeout=timeout_s)
        if r.status_code >= 400:
            raise EngineError(
                f"{url}/collective_rpc {body.get('method')}: HTTP {r.status_code} {r.text[:500]}"
            )
        return r.json() if r.content else {}

    def sync_mode(self, urls: list[str], setting: str = "") -> str:
        """ "memory" or "disk", decided at the first sync from `rollout.vllm.sync` (or `setting`) and what the servers
        carry."""
        from tirl.rollout.engines.openai.engine import EngineError

        if self._sync_mode:
            return self._sync_mode
        mode, counts = setting or self.vcfg.sync, {}
        if mode != "disk":
            if not self.api_key and mode == "memory":
                raise EngineError(
                    f"rollout.vllm.sync=memory needs the servers' key in ${wire.KEY_ENV} (the trainer's "
                    "environment), or set rollout.vllm.sync=disk (or auto)"
                )
            counts = {u: receiver_workers(self._post_rpc, u) if self.api_key else 0 for u in urls}
            missing = [u for u, n in counts.items() if n == 0]
            if missing and mode == "memory":
                raise EngineError(
                    f"rollout.vllm.sync=memory, but the vLLM server(s) {', '.join(missing)} have no tirl weight "
                    f"receiver with the trainer's key: start them with {wire.KEY_ENV}=<key> PYTHONPATH={RECEIVER_DIR} "
                    f"and {' '.join(receiver_args())}, or set rollout.vllm.sync=disk (or auto)"
                )
            mode = "disk" if missing else "memory"
        self.adopt_mode(mode, counts if mode == "memory" else {})
        return mode

    def adopt_mode(self, mode: str, counts: dict[str, int]) -> None:
        """Take the sync path decided (by rank 0, for every rank of a pool) with the receiver workers per server."""
        self._sync_mode, self._counts = mode, dict(counts)

    def use_sync(self, mode: str, urls: list[str]) -> None:
        """Take path `mode` from the next sync on (benchmarks and tests compare the two on one server)."""
        if mode not in ("memory", "disk"):
            raise ValueError(f"sync mode {mode!r}; valid: memory, disk")
        self._sync_mode = ""
        self.sync_mode(urls, setting=mode)

    def stream_into(self, urls: list[str], tensors: Iterable[tuple[str, torch.Tensor]]) -> StreamResult:
        """Stream `tensors` into the servers at `urls`, then reset their prefix caches. Runs `tensors` to its end."""
        from tirl.rollout.engines.openai.engine import EngineError

        assert self._sync_mode == "memory", "sync_mode() decides the path first"
        if self._stream is None:
            self._stream = self._listen()
        workers = sum(self._counts.get(u, 0) for u in urls)
        res = self._stream.push(tensors, urls, workers, self._post_rpc, SYNC_RPC_TIMEOUT_S)
        if res.error:
            raise EngineError(res.error)
        for url in urls:
            self.reset_prefix_cache(url)
        self.last_sync = res
        return res

    def _listen(self) -> WeightStream:
        """This process's weight listener on `rollout.vllm.sync_host`, which must be an address of its own machine."""
        from tirl.rollout.engines.openai.engine import EngineError

        host = self.vcfg.sync_host
        try:
            return WeightStream(host, key=self.api_key)
        except OSError as e:
            raise EngineError(
                f"cannot listen for the weight stream on rollout.vllm.sync_host={host} ({e}): it must be an address "
                "of this machine that the vLLM servers reach; on several machines each passes its own"
            ) from e

    def reset_prefix_cache(self, url: str | None = None) -> None:
        """Drop the server's cached KV blocks (the old weights computed them)."""
        from tirl.rollout.engines.openai.engine import EngineError

        for query in ("", "?reset_running_requests=true"):  # abandoned (timed-out) requests may hold blocks
            if self._request("POST", "/reset_prefix_cache" + query, url=url).get("success"):
                return
        raise EngineError(f"{url or 'the vLLM server'} did not reset its prefix cache after a weight sync")

    def close_stream(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None
