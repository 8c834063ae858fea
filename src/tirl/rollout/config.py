"""`rollout.*`: which engine samples the rollouts, how, and which agent loop drives it (`tirl.rollout.factory`).

The keys more than one engine reads sit at `rollout.*`; a key only one engine reads sits in that engine's own
section, `rollout.torch.*` or `rollout.vllm.*`, so a reader sees which settings a run's engine ignores. The openai
engine has no section: every key it reads (`urls`, `model_name`, `retries`, the request limits) the vllm engine
reads too when it samples from servers someone else started. The old flat names (`rollout.vllm_args`) are refused
with their new ones (`MOVED_KEYS`). This module knows nothing of the factory: the factory builds from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from tirl.rollout.capabilities import MODES
from tirl.rollout.packed import PACK_MODES

ENGINES = ("torch", "vllm", "openai")  # rollout.engine's values; tirl.rollout.factory has a builder for each
PLACEMENTS = ("separate", "colocated")
SYNCS = ("auto", "memory", "disk")
DTYPES = ("auto", "bfloat16", "float16", "float32")
GRAPH_MODES = ("auto", "on", "off")  # rollout.torch.cuda_graphs (tirl.rollout.graph_decode)


@dataclass
class TorchEngineConfig:
    """`rollout.torch.*`: the in-process engine (`tirl.rollout.engine.TorchEngine`)."""

    max_batch_size: int = 256  # sequences per engine forward
    # the keys and values of a call's finished rows kept (up to this many MiB) so that the next turn, which extends
    # them, pre-fills only its new tokens (tirl.rollout.kv_cache.KeptPrefixes); 0 = pre-fill every turn whole
    keep_prefix_mib: int = 1024
    # decode steps through torch.compile (dynamic shapes), compiled once per engine: pays on small models, whose
    # steps are mostly per-operation overhead (the demo's: 1.24-1.29x the eager engine), not on SmolLM2-135M on a
    # CPU (0.55-0.92x): off by default (docs/benchmarks.md#sampling-engines)
    compile: bool = False
    # on a CPU: the Linears' no-grad forwards on weights packed once per weight version for oneDNN
    # (tirl.rollout.packed). auto = bf16 decode always, fp32 on an AMD CPU (PyTorch's MKL path stops at AVX2
    # there: SmolLM2's fp32 decode 1.6-1.8x as fast packed) from 512 wide, never with rollout.torch.compile;
    # on = at any width on any CPU; off = PyTorch's own matmuls
    pack: str = "auto"
    # decode steps of static shapes captured as CUDA graphs, one per batch-size bucket, and replayed
    # (tirl.rollout.graph_decode). auto = on where the model is on a CUDA device and neither compiled nor sharded;
    # on = that or an error; off = the eager decode. Off by default: its speed on a GPU is not yet measured
    cuda_graphs: str = "off"
    # the static step of rollout.torch.cuda_graphs through torch.compile (static shapes, compiled once per bucket
    # and captured into its graph); needs cuda_graphs on or auto. Off by default: its speed on a GPU is not measured
    compile_graph_step: bool = False
    # the CUDA-graph decode's KV arena (tirl.rollout.graph_arena), allocated once and kept: GiB; 0 = a quarter of
    # the GPU's memory. A chunk whose rows x positions do not fit is refused with the numbers
    graph_kv_gib: float = 0.0

    def __post_init__(self) -> None:
        if self.pack not in PACK_MODES:
            raise ValueError(f"rollout.torch.pack must be one of {', '.join(PACK_MODES)}, got {self.pack!r}")
        if self.cuda_graphs not in GRAPH_MODES:
            raise ValueError(
                f"rollout.torch.cuda_graphs must be one of {', '.join(GRAPH_MODES)}, got {self.cuda_graphs!r}"
            )
        if self.compile_graph_step and self.cuda_graphs == "off":
            raise ValueError(
                "rollout.torch.compile_graph_step=true compiles the static step of rollout.torch.cuda_graphs, "
                "which is off: set rollout.torch.cuda_graphs=auto or on"
            )
        if not self.graph_kv_gib >= 0:  # NaN fails too
            raise ValueError(f"rollout.torch.graph_kv_gib must be >= 0 (0 = auto), got {self.graph_kv_gib}")
        if self.keep_prefix_mib < 0:
            raise ValueError(
                f"rollout.torch.keep_prefix_mib must be >= 0 (0 = off), got {self.keep_prefix_mib}"
            )


@dataclass
class VllmConfig:
    """`rollout.vllm.*`: the vLLM engine (`tirl.rollout.vllm_engine`, `vllm_pool`, `vllm_colocated`)."""

    python: str = ""  # the Python with vLLM; "" = $TIRL_VLLM_PYTHON, else the repository's .venv-vllm
    args: list[str] = field(default_factory=list)  # extra server args: [--max-model-len=4096]
    kv_cache_gib: float = 1.0  # KV cache size; 0 = vLLM's default (on GPU a share of its memory)
    port: int = 0  # 0 = a free port on 127.0.0.1
    startup_timeout_s: float = 600.0  # the server must answer within this
    # separate = servers beside the trainer, shared by every rank (tirl.rollout.vllm_pool); colocated = one engine
    # in each training process, asleep during updates (GPU only, tirl.rollout.vllm_colocated)
    placement: str = "separate"
    # how new weights reach the servers: memory = streamed over a socket into the workers (a worker extension every
    # managed server has), disk = a safetensors directory the servers reload, auto = memory where every server has
    # the receiver, else disk (tirl.rollout.vllm_sync)
    sync: str = "auto"
    sync_host: str = "127.0.0.1"  # sync=memory: the trainer's address as the servers reach it
    # on a CPU, one process: the server tirl starts is stopped (SIGSTOP) while the trainer updates, so its polling
    # costs the update no CPU (tirl.rollout.vllm_idle)
    pause_idle: bool = True

    def __post_init__(self) -> None:
        if self.kv_cache_gib < 0 or self.startup_timeout_s <= 0 or not 0 <= self.port < 65536:
            raise ValueError(
                "rollout.vllm.kv_cache_gib must be >= 0, rollout.vllm.startup_timeout_s > 0 and "
                f"rollout.vllm.port in 0..65535; got {self.kv_cache_gib}, {self.startup_timeout_s}, {self.port}"
            )
        if self.placement not in PLACEMENTS:
            raise ValueError(
                f"unknown rollout.vllm.placement {self.placement!r}; valid: {', '.join(PLACEMENTS)}"
            )
        if self.sync not in SYNCS:
            raise ValueError(f"unknown rollout.vllm.sync {self.sync!r}; valid: {', '.join(SYNCS)}")


@dataclass
class RolloutConfig:
    """Sampling for RL rollouts (evaluation has its own temperature and top_p in `eval`)."""

    # the flat keys of before the engine sections -> where they live now
    MOVED_KEYS: ClassVar[dict[str, str]] = {
        "max_batch_size": "rollout.torch.max_batch_size",
        "keep_prefix_mib": "rollout.torch.keep_prefix_mib",
        "compile": "rollout.torch.compile",
        "pack": "rollout.torch.pack",
        "vllm_python": "rollout.vllm.python",
        "vllm_args": "rollout.vllm.args",
        "vllm_kv_cache_gib": "rollout.vllm.kv_cache_gib",
        "vllm_port": "rollout.vllm.port",
        "vllm_startup_timeout_s": "rollout.vllm.startup_timeout_s",
        "vllm_pause_idle": "rollout.vllm.pause_idle",
        "placement": "rollout.vllm.placement",
        "sync": "rollout.vllm.sync",
        "sync_host": "rollout.vllm.sync_host",
    }

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    mode: str = "auto"  # lockstep | async | auto (lock-step for the torch engine, async for servers)
    concurrency: int = 64  # async: trajectories in flight at once
    timeout_s: float = 600.0  # async: a trajectory running longer is returned with stop reason "error"
    # torch (in-process) | vllm (a vLLM server tirl starts and syncs; tirl.rollout.vllm_engine)
    # | openai (a /v1/completions server someone else runs; eval only, no weight sync)
    engine: str = "torch"
    # openai: server base URLs, used round-robin; vllm: servers someone else started (tirl.rollout.vllm_pool)
    urls: list[str] = field(default_factory=list)
    # openai: the served model's name, checked against /v1/models; vllm with urls: that name ("" = tirl's own)
    model_name: str = ""
    retries: int = 3  # openai, vllm: attempts after the first, with exponential back-off
    request_timeout_s: float = 120.0  # openai, vllm: one HTTP request, on top of its budget's decode time
    # openai, vllm: decode tokens/s assumed for one request (a slower measured rate lengthens the limits):
    # a request may take request_timeout_s + max_tokens / rate, a trajectory timeout_s + its budget / this
    min_tokens_per_s: float = 5.0
    # torch: the decode's precision: bfloat16 = under bf16 autocast over the model's weights (log-probs then
    # corrected in RL), float32 = the weights' own; auto = the trainers' (model.autocast resolved: bf16 where the
    # device multiplies bf16 natively and the model is wide enough). vllm: the served weights' dtype (bfloat16,
    # float16, float32); auto = model.dtype. ("" reads as auto.)
    dtype: str = "auto"
    torch: TorchEngineConfig = field(default_factory=TorchEngineConfig)
    vllm: VllmConfig = field(default_factory=VllmConfig)

    def served_dtype(self, model_dtype: str) -> str:
        """The dtype a server engine (vLLM) serves the weights in: rollout.dtype, auto = model.dtype."""
        return model_dtype if self.dtype == "auto" else self.dtype

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ValueError(f"unknown rollout.engine {self.engine!r}; valid: {', '.join(ENGINES)}")
        if self.engine == "openai" and (not self.urls or not self.model_name):
            raise ValueError("rollout.engine=openai needs rollout.urls and rollout.model_name")
        if self.dtype == "":
            self.dtype = "auto"
        if self.dtype not in DTYPES:
            raise ValueError(f"rollout.dtype must be auto, bfloat16, float16 or float32, got {self.dtype!r}")
        if self.mode not in MODES:
            raise ValueError(f"unknown rollout.mode {self.mode!r}; valid: {', '.join(MODES)}")
        if self.min_tokens_per_s <= 0:
            raise ValueError(f"rollout.min_tokens_per_s must be > 0, got {self.min_tokens_per_s}")
        if self.concurrency < 1 or self.timeout_s <= 0:
            raise ValueError(
                f"rollout.concurrency must be >= 1 and timeout_s > 0, got {self.concurrency}, {self.timeout_s}"
            )
