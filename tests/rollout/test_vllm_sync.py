"""rollout.vllm.sync=memory's wire, both ends, without vLLM: the trainer's `WeightStream` and the server-side receiver
(`vllm_ext/tirl_weight_receiver.py`) on a fake worker whose `reload_weights` keeps what arrives."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator

import pytest
import torch

from conftest import closed_by_peer
from tirl.rollout.engines.vllm.ext import tirl_weight_receiver as receiver
from tirl.rollout.engines.vllm.ext.tirl_weight_receiver import WeightReceiver, open_stream, read_frames
from tirl.rollout.engines.vllm.sync import WeightStream, end_frame, frame, policy_tensors, receiver_workers

KEY = (
    "k" * 64
)  # the servers' key (tirl_weight_receiver.KEY_ENV); the fake workers read it from the environment


@pytest.fixture(autouse=True)
def server_key(monkeypatch):
    monkeypatch.setenv(receiver.KEY_ENV, KEY)
    monkeypatch.delenv(receiver.TARGET_ENV, raising=False)


def new_stream(**kw) -> WeightStream:
    return WeightStream(key=KEY, **kw)


class FakeWorker(WeightReceiver):
    def __init__(self) -> None:
        self.loaded: dict[str, torch.Tensor] = {}

    def reload_weights(self, weights_iterator=None, **_):
        for name, t in weights_iterator:
            self.loaded[name] = t.clone()


def fake_post(workers: list[FakeWorker]):
    """A `/collective_rpc` that calls the method on every fake worker of the server, as vLLM does."""

    def post(url, body, timeout_s):
        out: list = [None] * len(workers)

        def call(i: int) -> None:
            out[i] = getattr(workers[i], body["method"])(*body.get("args", []))

        threads = [threading.Thread(target=call, args=(i,)) for i in range(len(workers))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return {"results": out}

    return post


def tensors():
    g = torch.Generator().manual_seed(0)
    return [
        ("model.embed_tokens.weight", torch.randn(50, 8, generator=g)),
        ("model.layers.0.mlp.up_proj.weight", torch.randn(16, 8, generator=g).to(torch.bfloat16)),
        ("model.norm.weight", torch.ones(8, dtype=torch.float16)),
        ("model.scalar", torch.tensor(3.5)),
        ("model.empty", torch.zeros(0, 4)),
    ]


def test_stream_delivers_every_tensor_bit_exact_to_every_worker():
    workers = [FakeWorker(), FakeWorker()]
    stream = new_stream()
    try:
        res = stream.push(tensors(), ["http://a"], workers=2, post=fake_post(workers), rpc_timeout_s=30)
    finally:
        stream.close()
    assert res.error == "" and res.tensors == 5
    assert res.loaded == [{"results": [5, 5]}]
    for w in workers:
        assert list(w.loaded) == [n for n, _ in tensors()]
        for name, t in tensors():
            got = w.loaded[name]
            assert got.dtype == t.dtype and got.shape == t.shape
            assert torch.equal(got, t), name


def test_receiver_count_and_missing_receiver():
    assert receiver_workers(fake_post([FakeWorker(), FakeWorker()]), "http://a") == 2

    def no_method(url, body, timeout_s):
        raise RuntimeError(
            "HTTP 500 AttributeError: 'CPUWorker' object has no attribute 'tirl_receiver_info'"
        )

    assert receiver_workers(no_method, "http://a") == 0


def test_a_failed_server_fails_the_sync_and_still_runs_every_gather():
    seen = []

    def gathered():
        for item in tensors():
            seen.append(item[0])
            yield item

    def broken(url, body, timeout_s):
        raise RuntimeError("HTTP 500 the server died")

    stream = new_stream(accept_timeout_s=5)
    try:
        res = stream.push(gathered(), ["http://dead"], workers=1, post=broken, rpc_timeout_s=5)
    finally:
        stream.close()
    assert "the server died" in res.error
    assert len(seen) == 5  # under FSDP the other ranks' gathers must complete


def test_no_receiver_connecting_times_out_with_a_clear_error():
    def never_connects(url, body, timeout_s):
        threading.Event().wait(3)
        return {}

    stream = new_stream(accept_timeout_s=0.5)
    try:
        res = stream.push(tensors(), ["http://a"], workers=1, post=never_connects, rpc_timeout_s=5)
    finally:
        stream.close()
    assert "0 of 1 vLLM workers connected" in res.error


def test_a_connection_without_the_token_is_refused():
    stream = new_stream(accept_timeout_s=3)
    intruder_got: list[bytes] = []

    def post(url, body, timeout_s):
        host, port, token, recv_timeout, mac = body["args"]
        s, _ = open_stream(host, port, "not-the-token", 5)
        with s:  # refused: closed without a byte
            try:
                intruder_got.append(s.recv(10))
            except ConnectionResetError:
                intruder_got.append(b"")
        return FakeWorker().tirl_receive_weights(host, port, token, recv_timeout, mac)

    try:
        res = stream.push(tensors(), ["http://a"], workers=1, post=post, rpc_timeout_s=10)
    finally:
        stream.close()
    assert res.error == "" and intruder_got == [b""]


def _connect(port: int, sent: bytes = b"") -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(sent)
    return s


def test_idle_strangers_do_not_use_up_the_accept_window():
    """Security: 20 connections that send nothing (before the receivers), a slow-loris and two wrong tokens must not
    delay the receivers; the window is 5 s, the old serial handshake gave each stranger 10 s."""
    stream = new_stream(accept_timeout_s=5)
    strangers = [_connect(stream.port) for _ in range(20)]
    strangers.append(_connect(stream.port, b"\x20\x00"))  # half a header, then silence
    wrong = [
        _connect(stream.port, sent) for sent in (b"\x20\x00\x00\x00" + b"0" * 32, b"\x05\x00\x00\x00hello")
    ]
    workers = [FakeWorker(), FakeWorker()]
    try:
        t0 = time.monotonic()
        res = stream.push(tensors(), ["http://a"], workers=2, post=fake_post(workers), rpc_timeout_s=30)
        took = time.monotonic() - t0
    finally:
        stream.close()
    assert res.error == "" and res.loaded == [{"results": [5, 5]}]
    assert took < 4.0  # the old serial handshake needed 10 s for the first stranger alone
    try:
        assert all(closed_by_peer(s, 5.0) for s in wrong + strangers)  # none of them is still held
    finally:
        for s in wrong + strangers:
            s.close()


def test_a_silent_or_slow_stranger_is_dropped_at_its_own_deadline():
    stream = new_stream(accept_timeout_s=10, handshake_timeout_s=0.3)
    silent, slow = _connect(stream.port), _connect(stream.port, b"\x20")
    seen: list[bool] = []

    def post(url, body, timeout_s):  # the receiver connects only once both strangers are gone
        seen.extend([closed_by_peer(silent, 5.0), closed_by_peer(slow, 5.0)])
        return fake_post([FakeWorker()])(url, body, timeout_s)

    try:
        res = stream.push(tensors(), ["http://a"], workers=1, post=post, rpc_timeout_s=30)
    finally:
        stream.close()
        silent.close()
        slow.close()
    assert seen == [True, True] and res.error == ""


def test_unauthenticated_connections_are_bounded():
    stream = new_stream(accept_timeout_s=10, handshake_timeout_s=60, max_pending=4)
    strangers = [_connect(stream.port) for _ in range(10)]
    dropped: list[bool] = []

    def post(url, body, timeout_s):  # 4 held, each for its grace second; the 6 newcomers are closed at once
        dropped.extend(closed_by_peer(s, 0.3 if i < 4 else 5.0) for i, s in enumerate(strangers))
        return fake_post([FakeWorker()])(
            url, body, timeout_s
        )  # makes room: the oldest stranger has had its grace

    try:
        res = stream.push(tensors(), ["http://a"], workers=1, post=post, rpc_timeout_s=30)
    finally:
        stream.close()
        for s in strangers:
            s.close()
    assert dropped == [False] * 4 + [True] * 6 and res.error == ""


def test_the_fullest_source_makes_room():
    """At the cap in all, a newcomer from another address pushes out the oldest of the address holding most."""
    stream = new_stream(accept_timeout_s=10, handshake_timeout_s=60, max_pending=3, grace_s=0)
    first = _connect(stream.port)  # from 127.0.0.1
    flood = [_connect(stream.port) for _ in range(2)]
    other = socket.create_connection(("127.0.0.1", stream.port), timeout=5, source_address=("127.0.0.2", 0))
    dropped: list[bool] = []

    def post(url, body, timeout_s):
        dropped.extend(closed_by_peer(s, 0.3) for s in (first, *flood, other))
        return fake_post([FakeWorker()])(url, body, timeout_s)

    try:
        res = stream.push(tensors(), ["http://a"], workers=1, post=post, rpc_timeout_s=30)
    finally:
        stream.close()
        for s in (first, *flood, other):
            s.close()
    assert dropped == [True, False, False, False] and res.error == ""


FLOOD = """
import socket, sys, time
port, most, end = int(sys.argv[1]), int(sys.argv[2]), time.monotonic() + float(sys.argv[3])
held = []
while len(held) < most and time.monotonic() < end:
    try:
        s = socket.socket()
    except OSError:  # out of descriptors: hold what is open
        break
    s.setblocking(False)
    s.connect_ex(("127.0.0.1", port))
    held.append(s)
    if len(held) == 200:
        print("flooding", flush=True)
time.sleep(max(0.0, end - time.monotonic()))
"""


@contextlib.contextmanager
def connection_flood(port: int) -> Iterator[subprocess.Popen]:
    """Another process opening non-blocking connections to `port` as fast as it can and holding them: at most 2,000,
    for at most 3 s (then it exits, closing them); its stdout says "flooding" once 200 are open."""
    cmd = ["timeout", "-s", "KILL", "30", sys.executable, "-c", FLOOD, str(port), "2000", "3"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def late_token(connected: Callable[[], None], opened: list[int]):
    """The receiver's `open_stream` on a loaded server: the token goes out 100 ms after `connected()` returns."""

    def open_late(host: str, port: int, token: str, timeout_s: float) -> tuple[socket.socket, bytes]:
        sock = socket.create_connection((host, int(port)), timeout=timeout_s)
        opened.append(1)
        connected()
        time.sleep(0.1)
        nonce = bytes(receiver.NONCE_BYTES)
        sock.sendall(receiver.HEADER.pack(len(token)) + token.encode() + nonce)
        return sock, nonce

    return open_late


def test_a_held_receiver_sending_its_token_late_is_not_pushed_out_by_a_connection_flood(monkeypatch):
    """Security: the receiver connects, a flood of 2,000 connections follows, its token 100 ms later. Before, each
    newcomer past 64 dropped the oldest held connection, the receiver first ("the trainer closed the weight stream
    after 0 of 4 bytes"); now it keeps its place for its grace second, on its first connection."""
    stream = new_stream(accept_timeout_s=20)
    opened: list[int] = []
    with contextlib.ExitStack() as floods:

        def flood_now() -> None:  # once the receiver has connected
            if len(opened) == 1:
                flood = floods.enter_context(connection_flood(stream.port))
                assert flood.stdout.readline() == "flooding\n"

        monkeypatch.setattr(receiver, "open_stream", late_token(flood_now, opened))
        try:
            res = stream.push(
                tensors(), ["http://a"], workers=1, post=fake_post([FakeWorker()]), rpc_timeout_s=30
            )
        finally:
            stream.close()
    assert res.error == "" and res.loaded == [{"results": [5]}] and len(opened) == 1


def test_a_receiver_connecting_during_a_connection_flood_gets_through(monkeypatch):
    """Security: the receiver connects while a flood holds every place (its token 100 ms late): it is closed at once,
    connects again, and gets a place once the flood's connections have had their grace second."""
    stream = new_stream(accept_timeout_s=20)
    opened: list[int] = []
    with connection_flood(stream.port) as flood:

        def post(url, body, timeout_s):
            assert flood.stdout.readline() == "flooding\n"
            return fake_post([FakeWorker()])(url, body, timeout_s)

        monkeypatch.setattr(receiver, "open_stream", late_token(lambda: None, opened))
        try:
            res = stream.push(tensors(), ["http://a"], workers=1, post=post, rpc_timeout_s=30)
        finally:
            stream.close()
    assert res.error == "" and res.loaded == [{"results": [5]}]


def test_malformed_frames_raise():
    a, b = socket.socketpair()
    with a, b:
        a.sendall((10**7).to_bytes(4, "little"))
        with pytest.raises(ValueError, match="frame header"):
            next(read_frames(b))
    a, b = socket.socketpair()
    with a, b:
        head, data = frame("x", torch.ones(2))
        a.sendall(head[:6])
        a.close()
        with pytest.raises(ConnectionError, match="closed the weight stream"):
            next(read_frames(b))
    a, b = socket.socketpair()
    with a, b:
        a.sendall(end_frame())
        assert list(read_frames(b)) == []
    with pytest.raises(TypeError, match="cannot be streamed"):
        frame("ids", torch.ones(2, dtype=torch.int64))


def small_model(seed: int = 0):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=True)  # fmt: skip
    return Qwen2ForCausalLM(cfg)


def test_policy_tensors_untie_and_lora_merge():
    from tirl.models.lora import LoraConfig, apply_lora

    names = [n for n, _ in policy_tensors(small_model(), untie=False)]
    assert "lm_head.weight" not in names  # tied: sent once, as save_pretrained does
    untied = dict(policy_tensors(small_model(), untie=True))
    assert torch.equal(untied["lm_head.weight"], untied["model.embed_tokens.weight"])
    lora = apply_lora(small_model(), LoraConfig(rank=4))
    with torch.no_grad():
        for n, p in lora.named_parameters():
            if "lora_B" in n:
                p.fill_(0.01)
    merged = dict(policy_tensors(lora, untie=False))
    assert sorted(merged) == sorted(names)
    plain = dict(policy_tensors(small_model(), untie=False))
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(merged[q], plain[q])  # the adapter is folded in
    assert torch.equal(merged["model.norm.weight"], plain["model.norm.weight"])


def test_policy_tensors_cross_the_wire_in_the_served_dtype():
    """fp32 weights served in bf16 are sent as bf16 (half the bytes), rounded as vLLM's own load would round them;
    served as trained, or under a dtype name the wire does not know ("auto"), they are sent unchanged."""
    model = small_model()
    fp32 = dict(policy_tensors(model, untie=True))
    bf16 = dict(policy_tensors(model, untie=True, dtype="bfloat16"))
    assert sorted(bf16) == sorted(fp32)
    for name, t in bf16.items():
        assert t.dtype == torch.bfloat16 and torch.equal(t, fp32[name].to(torch.bfloat16)), name
    sent = sum(len(frame(n, t)[1]) for n, t in bf16.items())
    assert sent * 2 == sum(len(frame(n, t)[1]) for n, t in fp32.items())
    for same in ("float32", "auto", ""):
        assert all(t.dtype == torch.float32 for _, t in policy_tensors(model, untie=False, dtype=same))


def test_a_sync_host_of_another_machine_is_refused_naming_it():
    """Every rank listens on rollout.vllm.sync_host: an address that is not this machine's (the same value given
    to every node) is an error naming the setting, not a traceback from bind()."""
    from types import SimpleNamespace

    from tirl.rollout.engines.openai.engine import EngineError
    from tirl.rollout.engines.vllm.sync import ServerSync

    sync = ServerSync()
    sync.vcfg, sync.api_key = SimpleNamespace(sync_host="192.0.2.1"), KEY  # TEST-NET-1: never local
    with pytest.raises(EngineError, match="rollout.vllm.sync_host=192.0.2.1 .*each passes its own"):
        sync._listen()
    sync.vcfg.sync_host = "127.0.0.2"  # any address of this machine will do
    stream = sync._listen()
    assert stream.address.startswith("127.0.0.2:")
    stream.close()
