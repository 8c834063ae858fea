"""The one configuration tree of a tirl run: every command reads the sections it needs.

Load with `tirl.config.load_config(TirlConfig, path, overrides)`. The dataclass defaults are the reference recipe's
values where it has one (learning rates, clip range, turn limit); `configs/demo.yaml` holds the tiny demo's setting.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tirl.eval.evaluate import EvalConfig
from tirl.fidelity import apply_fidelity
from tirl.models.loading import ModelConfig
from tirl.models.tiny import TinyModelConfig
from tirl.rewards.shaping import RewardConfig
from tirl.rollout.agent import AgentConfig
from tirl.rollout.config import RolloutConfig
from tirl.sandbox.local import SandboxConfig
from tirl.tasks.arith import STYLES
from tirl.tasks.solver import SolverConfig
from tirl.train.dist import DistConfig
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


@dataclass
class LoggingConfig:
    backends: list[str] = field(default_factory=lambda: ["console", "jsonl"])


@dataclass
class TirlConfig:
    # tirl | recipe: "recipe" puts every setting of tirl.fidelity.ROWS at the reference recipe's value
    fidelity: str = "tirl"
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
    dist: DistConfig = field(default_factory=DistConfig)  # torchrun runs; the world size comes from torchrun

    def __post_init__(self) -> None:
        if self.threads < 0:  # torch.set_num_threads would refuse it only once the run has started
            raise ValueError(f"threads must be >= 0 (0 = all cores), got {self.threads}")
        apply_fidelity(self, self.fidelity)


__all__ = ["OptimConfig", "RolloutConfig", "TirlConfig"]
