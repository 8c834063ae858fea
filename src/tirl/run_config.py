"""The one configuration tree of a tirl run: every command reads the sections it needs.

Load with `tirl.config.load_config(TirlConfig, path, overrides)`. The dataclass defaults are the reference recipe's
values where it has one (learning rates, clip range, turn limit); `configs/demo.yaml` holds the tiny demo's setting.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tirl.eval.evaluate import EvalConfig
from tirl.models.loading import ModelConfig
from tirl.models.tiny import TinyModelConfig
from tirl.rewards.shaping import RewardConfig
from tirl.rollout.agent import AgentConfig
from tirl.sandbox.local import SandboxConfig
from tirl.tasks.arith import STYLES
from tirl.tasks.solver import SolverConfig
from tirl.train.optim import OptimConfig
from tirl.train.rl import RLConfig
from tirl.train.sft import SFTConfig


@dataclass
class TaskConfig:
    """The run's task (`name`: registered, or package.module:attribute; see tirl.tasks.task) and the settings of the
    demo's arithmetic task (see tirl.tasks.arith)."""

    name: str = "arith"
    num_sft: int = 3000
    num_rl: int = 2000
    num_test: int = 200
    levels: list[int] = field(default_factory=lambda: [1, 2, 3])
    style: str = "plain"  # plain | word | mixed questions (see tirl.tasks.arith)
    solver: SolverConfig = field(default_factory=SolverConfig)

    def __post_init__(self) -> None:
        if min(self.num_sft, self.num_rl, self.num_test) < 1:
            raise ValueError("task.num_sft, num_rl and num_test must be >= 1")
        if not self.name:
            raise ValueError("task.name must name a task (e.g. arith, or my_pkg.tasks:my_task)")
        if self.style not in STYLES:
            raise ValueError(f"unknown style {self.style!r}; valid: {list(STYLES)}")


@dataclass
class ChatConfig:
    system_prompt: str = (
        ""  # prepended as a system message when a conversation has none; "" = no system message
    )
    format: str = "chatml"  # chatml (tiny models) | qwen2.5 | qwen3: see tirl.chat.template
    enable_thinking: bool = True  # qwen3 only: False puts an empty <think> block in every assistant header

    def __post_init__(self) -> None:
        from tirl.chat.template import FORMATS

        if self.format not in FORMATS:
            raise ValueError(f"unknown chat.format {self.format!r}; valid: {', '.join(FORMATS)}")


ENGINES = ("torch", "vllm", "openai")


@dataclass
class RolloutConfig:
    """Sampling for RL rollouts (evaluation has its own temperature and top_p in `eval`)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_batch_size: int = 256  # sequences per engine forward
    mode: str = "auto"  # lockstep | async | auto (lock-step for the torch engine, async for servers)
    concurrency: int = 64  # async: trajectories in flight at once
    timeout_s: float = 600.0  # async: a trajectory running longer is returned with stop reason "error"
    # torch (in-process) | vllm (a vLLM server tirl starts and syncs; tirl.rollout.vllm_engine)
    # | openai (a /v1/completions server someone else runs; eval only, no weight sync)
    engine: str = "torch"
    urls: list[str] = field(default_factory=list)  # openai: server base URLs, used round-robin
    model_name: str = ""  # openai: the served model's name, checked against /v1/models
    retries: int = 3  # openai, vllm: attempts after the first, with exponential back-off
    request_timeout_s: float = 120.0  # openai, vllm: one HTTP request
    # vllm: the Python with vLLM; "" = $TIRL_VLLM_PYTHON, else the repository's .venv-vllm
    vllm_python: str = ""
    vllm_args: list[str] = field(default_factory=list)  # vllm: extra server args: [--max-model-len, 4096]
    vllm_kv_cache_gib: float = 1.0  # vllm: KV cache size; 0 = vLLM's default (on GPU a share of its memory)
    vllm_port: int = 0  # vllm: 0 = a free port on 127.0.0.1
    vllm_startup_timeout_s: float = 600.0  # vllm: the server must answer within this

    def __post_init__(self) -> None:
        from tirl.rollout.modes import MODES

        if self.engine not in ENGINES:
            raise ValueError(f"unknown rollout.engine {self.engine!r}; valid: {', '.join(ENGINES)}")
        if self.engine == "openai" and (not self.urls or not self.model_name):
            raise ValueError("rollout.engine=openai needs rollout.urls and rollout.model_name")
        if self.vllm_kv_cache_gib < 0 or self.vllm_startup_timeout_s <= 0 or not 0 <= self.vllm_port < 65536:
            raise ValueError(
                "rollout.vllm_kv_cache_gib must be >= 0, rollout.vllm_startup_timeout_s > 0 and rollout.vllm_port "
                f"in 0..65535; got {self.vllm_kv_cache_gib}, {self.vllm_startup_timeout_s}, {self.vllm_port}"
            )

        if self.mode not in MODES:
            raise ValueError(f"unknown rollout.mode {self.mode!r}; valid: {', '.join(MODES)}")
        if self.concurrency < 1 or self.timeout_s <= 0:
            raise ValueError(
                f"rollout.concurrency must be >= 1 and timeout_s > 0, got {self.concurrency}, {self.timeout_s}"
            )


@dataclass
class LoggingConfig:
    backends: list[str] = field(default_factory=lambda: ["console", "jsonl"])


@dataclass
class TirlConfig:
    seed: int = 0
    out_dir: str = "runs/demo"
    threads: int = 0  # torch intra-op threads; 0 = all cores
    model: ModelConfig = field(default_factory=ModelConfig)
    tiny: TinyModelConfig = field(default_factory=TinyModelConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    chat: ChatConfig = field(default_factory=ChatConfig)
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    warmup: SFTConfig = field(
        default_factory=lambda: SFTConfig(epochs=0)
    )  # demo: copy warm-up of the tiny model
    sft: SFTConfig = field(default_factory=SFTConfig)
    rl: RLConfig = field(default_factory=RLConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)


__all__ = ["TirlConfig", "OptimConfig"]
