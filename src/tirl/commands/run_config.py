"""The one configuration tree of a tirl run: every command reads the sections it needs.

Load with `tirl.core.config.load_config(TirlConfig, path, overrides)`. The dataclass defaults are the reference recipe's
values where it has one (learning rates, clip range, turn limit); `configs/demo.yaml` holds the tiny demo's setting.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from tirl.core.fidelity import check_fidelity, recipe_data
from tirl.eval.config import EvalConfig
from tirl.models.config import ModelConfig, TinyModelConfig
from tirl.rewards.config import RewardConfig
from tirl.rollout.agent.config import AgentConfig
from tirl.rollout.config import RolloutConfig
from tirl.sandbox.config import SandboxConfig
from tirl.tasks.task import TaskOptions, default_task_options
from tirl.train.config import DistConfig, OptimConfig, SFTConfig
from tirl.train.rl.config import RLConfig


@dataclass
class ChatConfig:
    system_prompt: str = (
        ""  # prepended as a system message when a conversation has none; "" = no system message
    )
    # chatml (tiny models) | qwen2.5 | qwen3 | template (the tokenizer's own, checked) | auto: see tirl.chat.template
    format: str = "chatml"
    enable_thinking: bool = True  # qwen3 only: False puts an empty <think> block in every assistant header
    # hermes (JSON) | qwen3_xml (Qwen3-Coder) | json (Llama 3.1) | template (the chat template's own, read with the
    # format that matches it; chat.format template or auto): see tirl.chat.tool_formats
    tool_format: str = "hermes"
    # exact: a template that re-renders history is refused | per_turn: SFT trains each assistant turn as its own
    # sample (prompt: the template's rendering before it), RL and eval refuse such a template: see tirl.chat.per_turn
    history: str = "exact"

    def __post_init__(self) -> None:
        from tirl.chat.per_turn import HISTORY
        from tirl.chat.template import FORMATS, HAND_FORMATS
        from tirl.chat.tool_formats import TEMPLATE, tool_format

        if self.format not in FORMATS:
            raise ValueError(f"unknown chat.format {self.format!r}; valid: {', '.join(FORMATS)}")
        if self.tool_format != TEMPLATE:
            tool_format(self.tool_format)  # an unknown name raises listing the valid ones
        elif self.format in HAND_FORMATS:
            raise ValueError(
                f"chat.tool_format=template needs chat.format=template or auto, not {self.format}"
            )
        if self.history not in HISTORY:
            raise ValueError(f"unknown chat.history {self.history!r}; valid: {', '.join(HISTORY)}")


MAX_THREADS = 1024  # far above any machine's cores; fixed, so a config reads the same on every machine
MAX_SEED = 2**32 - 1  # the range every generator a run seeds takes (numpy's RandomState the narrowest)


@dataclass
class LoggingConfig:
    backends: list[str] = field(default_factory=lambda: ["console", "jsonl"])


@dataclass
class DemoConfig:
    """`demo.*`: what only the tiny demo reads, the model it builds from scratch and that model's copy warm-up
    (tirl.tasks.arith.warmup) before SFT. Every other command ignores it."""

    tiny: TinyModelConfig = field(default_factory=TinyModelConfig)  # the tiny model's shape
    warmup: SFTConfig = field(default_factory=lambda: SFTConfig(epochs=0))  # 0 epochs: no warm-up


@dataclass
class TirlConfig:
    MOVED_KEYS: ClassVar[dict[str, str]] = {"warmup": "demo.warmup", "tiny": "demo.tiny"}

    # tirl | recipe: "recipe" puts every setting of tirl.core.fidelity.ROWS the config does not set at the
    # reference recipe's value (when the config is loaded)
    fidelity: str = "tirl"
    seed: int = 0  # 0 <= seed <= MAX_SEED
    out_dir: str = "runs/demo"
    threads: int = 0  # torch intra-op threads; 0 = all cores, at most MAX_THREADS
    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskOptions = field(default_factory=default_task_options)  # the task's own dataclass (task.name)
    chat: ChatConfig = field(default_factory=ChatConfig)
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    rl: RLConfig = field(default_factory=RLConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    dist: DistConfig = field(default_factory=DistConfig)  # torchrun runs; the world size comes from torchrun
    demo: DemoConfig = field(default_factory=DemoConfig)  # the tiny demo's model and warm-up

    def __post_init__(self) -> None:
        if self.threads < 0:  # torch.set_num_threads would refuse it only once the run has started
            raise ValueError(f"threads must be >= 0 (0 = all cores), got {self.threads}")
        if self.threads > MAX_THREADS:  # a million threads end the run in a segmentation fault
            raise ValueError(f"threads must be <= {MAX_THREADS} (0 = all cores), got {self.threads}")
        # torch.manual_seed overflows past 64 bits ("Overflow when unpacking long long"), numpy's legacy seeds at 32
        if not 0 <= self.seed <= MAX_SEED:
            raise ValueError(f"seed must be within 0..{MAX_SEED} (2**32 - 1), got {self.seed}")
        check_fidelity(self.fidelity)

    @classmethod
    def resolve_data(cls, data: dict[str, Any]) -> dict[str, Any]:
        """`fidelity: recipe` fills in the rows the loaded config leaves out (tirl.core.fidelity)."""
        return recipe_data(data)


__all__ = ["OptimConfig", "RolloutConfig", "TirlConfig"]
