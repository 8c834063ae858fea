"""`rollout.*`: which engine samples the rollouts, how, and which agent loop drives it (`tirl.rollout.factory`).

The keys more than one engine reads sit at `rollout.*`, declared here; a key only one engine reads sits in that
engine's own section, `rollout.<engine>.*`, so a reader sees which settings a run's engine ignores. This module
names no engine: `tirl.rollout.engines.registry` finds each one's folder, and the engine's `config.py` gives its
section (`SECTION`, added as a field by `with_sections`: `rollout.torch.*` is `TorchEngineConfig` in
`engines/torch/config.py`) and the keys here it needs set (`REQUIRED_KEYS`). The old flat names (`rollout.vllm_args`)
are refused with their new ones (`MOVED_KEYS`). This module knows nothing of the factory: the factory builds from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from tirl.core.bounds import MAX_COUNT, MAX_IN_FLIGHT, MAX_RETRIES, check_counts
from tirl.core.config import with_sections
from tirl.rollout.capabilities import MODES
from tirl.rollout.engines.registry import ENGINES, REQUIRED_KEYS, SECTIONS

DTYPES = ("auto", "bfloat16", "float16", "float32")


@dataclass
@with_sections(SECTIONS)  # rollout.<engine>.*, after the keys below
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
    # a package tirl.rollout.engines.<name> (ENGINES): torch (in-process) | vllm (a vLLM server tirl starts and
    # syncs) | openai (a /v1/completions server someone else runs; eval only, no weight sync); docs/engines.md
    engine: str = "torch"
    # openai: server base URLs, used round-robin; vllm: servers someone else started (tirl.rollout.engines.vllm.pool)
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

    def served_dtype(self, model_dtype: str) -> str:
        """The dtype a server engine (vLLM) serves the weights in: rollout.dtype, auto = model.dtype."""
        return model_dtype if self.dtype == "auto" else self.dtype

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ValueError(f"unknown rollout.engine {self.engine!r}; valid: {', '.join(ENGINES)}")
        needed = REQUIRED_KEYS.get(self.engine, ())
        if not all(getattr(self, key) for key in needed):
            needs = " and ".join(f"rollout.{key}" for key in needed)
            raise ValueError(f"rollout.engine={self.engine} needs {needs}")
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
        # top_k: -1 (off) or a count of tokens, at most a vocabulary's (the largest hold ~256k)
        bounds = {
            "top_k": (-1, MAX_COUNT * 16),
            "concurrency": (1, MAX_IN_FLIGHT),
            "retries": (0, MAX_RETRIES),
        }
        check_counts(self, "rollout", bounds)
