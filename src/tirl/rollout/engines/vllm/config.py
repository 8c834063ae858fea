"""`rollout.vllm.*`: the vLLM engine's own settings (`SECTION`: a section of
`tirl.rollout.config.RolloutConfig`, found by `tirl.rollout.engines.registry`)."""

from __future__ import annotations

from dataclasses import dataclass, field

PLACEMENTS = ("separate", "colocated")
SYNCS = ("auto", "memory", "disk")  # rollout.vllm.sync (tirl.rollout.engines.vllm.sync)


@dataclass
class VllmConfig:
    """`rollout.vllm.*`: the vLLM engine (`engine`, `pool`, `colocated` of this package)."""

    python: str = ""  # the Python with vLLM; "" = $TIRL_VLLM_PYTHON, else the repository's .venv-vllm
    args: list[str] = field(default_factory=list)  # extra server args: [--max-model-len=4096]
    kv_cache_gib: float = 1.0  # KV cache size; 0 = vLLM's default (on GPU a share of its memory)
    port: int = 0  # 0 = a free port
    # the interface the server tirl starts binds; ranks on other nodes reach it there (servers of their own:
    # `tirl serve-vllm` and rollout.urls)
    host: str = "127.0.0.1"
    startup_timeout_s: float = 600.0  # the server must answer within this
    # separate = servers beside the trainer, shared by every rank (tirl.rollout.engines.vllm.pool); colocated = one engine
    # in each training process, asleep during updates (GPU only, tirl.rollout.engines.vllm.colocated)
    placement: str = "separate"
    # how new weights reach the servers: memory = streamed over a socket into the workers (a worker extension every
    # managed server has), disk = a safetensors directory the servers reload, auto = memory where every server has
    # the receiver, else disk (tirl.rollout.engines.vllm.sync)
    sync: str = "auto"
    sync_host: str = "127.0.0.1"  # sync=memory: the trainer's address as the servers reach it
    # on a CPU, one process: the server tirl starts is stopped (SIGSTOP) while the trainer updates, so its polling
    # costs the update no CPU (tirl.rollout.engines.vllm.idle)
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


SECTION = VllmConfig  # rollout.vllm.* (tirl.rollout.engines.registry)
