"""What each engine package declares about itself (`SPEC` in `tirl.rollout.engines.<name>.spec`): how it is built
from `rollout.*`, what it needs of a GPU's memory for `tirl plan`, and what it refuses before any model loads.

The factory and `tirl plan` ask the spec; neither knows an engine by name, so a new engine is a new package.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from tirl.rollout.config import RolloutConfig
    from tirl.rollout.engines.base import Engine

GIB = 1024**3
BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class EngineInputs:
    """What an engine is built from besides `rollout.*`: the policy (the torch engine samples from it; vllm serves
    `model_path`, or the policy written out when that is no plain Hugging Face directory), its tokenizer, the ids that
    end a turn, and where a server engine's log and synced weights go (`work_dir`/vllm; temporary without one)."""

    model: torch.nn.Module
    tokenizer: Any
    eos_id: int
    pad_id: int
    stop_ids: tuple[int, ...] = ()
    dtype: str = "float32"  # model.dtype: a server engine computes in it unless rollout.dtype says otherwise
    # model.autocast resolved: the torch engine's precision on rollout.dtype auto
    autocast: torch.dtype | None = None
    model_path: str = ""
    work_dir: Path | None = None


@dataclass(frozen=True)
class MemoryQuery:
    """One RL process's situation, as `tirl plan` sees it: the model's architecture (a transformers config) and
    parameter count, the longest sequence, the trajectories of a step, the processes and one GPU's memory, and what
    the trainer keeps on that GPU through the rollouts (`resident_gib`: weights, gradients, optimizer state,
    reference, reserve)."""

    rollout: RolloutConfig
    hf_config: Any
    params: int
    model_dtype: str  # model.dtype
    compute_bytes: int  # 2 where the trainer computes in bf16 (autocast or a bf16 model), else 4
    sequence_tokens: int
    trajectories: int  # rl.prompts_per_step x rl.n
    world: int
    gpu_gib: float
    resident_gib: float

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """Keys and values of one position over every layer."""
        hf = self.hf_config
        head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
        kv_heads = getattr(hf, "num_key_value_heads", None) or hf.num_attention_heads
        return 2 * hf.num_hidden_layers * kv_heads * head_dim * dtype_bytes


@dataclass(frozen=True)
class EngineMemory:
    """An engine's GPU memory during the rollouts (GiB, on top of `resident_gib` where it shares the trainer's GPU),
    where it runs and what the figure is made of, in words, and whether it fits."""

    gib: float
    where: str
    fits: bool


@dataclass(frozen=True)
class EngineSpec:
    """One engine (module docstring). `engine`: its class as "module:Class", imported only when asked about (its
    `capabilities` answer what RL may do with it); `build`: the engine from `rollout.*` and the inputs; `memory`:
    its share of a GPU for `tirl plan`; `preflight`: settings this machine cannot run, refused before any model
    loads."""

    name: str
    engine: str
    build: Callable[[RolloutConfig, EngineInputs], Engine]
    memory: Callable[[MemoryQuery], EngineMemory]
    preflight: Callable[[RolloutConfig], None] = lambda ro: None
