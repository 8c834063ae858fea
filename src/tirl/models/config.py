"""`model:` of a run's config: the model's path, its precision options and its LoRA adapter (`model.lora`), checked
when loaded; and `demo.tiny`, the shape of the model `tirl demo` builds from scratch (`tirl.models.tiny`). Loading reads it (`tirl.models.loading`, `tirl.models.lora`); the precision options and why: the
docstring of `tirl.models.loading`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch

from tirl.core.bounds import MAX_TOKENS, check_counts, check_range
from tirl.models.precision import bf16_pays

ALL_LINEAR = "all-linear"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
AUTOCAST = {"none": None, "bfloat16": torch.bfloat16, "auto": None}  # auto: bfloat16 where native_bf16


@dataclass
class LoraConfig:
    """`rank` 0 is full fine-tuning. Defaults follow the LoRA-for-RL results (docs/configuration.md, "Memory
    options and LoRA"): every linear layer of the decoder (attention and MLP; peft's "all-linear" leaves the LM
    head out), alpha 32, no dropout."""

    rank: int = 0
    alpha: float = 32.0
    dropout: float = 0.0
    target_modules: list[str] = field(default_factory=lambda: [ALL_LINEAR])

    def __post_init__(self) -> None:
        if not 0 <= self.rank <= 1 << 16:  # at most a model's width (the widest: ~16k)
            raise ValueError(f"lora.rank must be 0-{1 << 16} (0 = full fine-tuning), got {self.rank}")
        if self.alpha <= 0:
            raise ValueError(f"lora.alpha must be > 0, got {self.alpha}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"lora.dropout must be in [0, 1), got {self.dropout}")
        if not self.target_modules or not all(isinstance(t, str) and t for t in self.target_modules):
            raise ValueError(
                f"lora.target_modules must be a non-empty list of module names (or ['all-linear']), "
                f"got {self.target_modules!r}"
            )
        if ALL_LINEAR in self.target_modules and len(self.target_modules) > 1:
            raise ValueError(f"lora.target_modules: 'all-linear' stands alone, got {self.target_modules!r}")

    @property
    def enabled(self) -> bool:
        return self.rank > 0


@dataclass
class ModelConfig:
    # a local Hugging Face model directory, or a Hub id org/name[@revision] (tirl.models.hub); the demo fills it
    # with the tiny model it builds
    path: str = ""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    attn_implementation: str = "sdpa"
    device: str = "cpu"
    # Recompute each decoder layer's activations in the backward pass instead of keeping them: less memory for
    # long responses at about one extra forward's cost. Off by default (the CPU demo's activations are small).
    gradient_checkpointing: bool = False
    # Forward/backward of the trainers under torch.autocast with float32 weights and AdamW state (module docstring)
    autocast: Literal["none", "bfloat16", "auto"] = "auto"
    ref_dtype: Literal["", "float32", "bfloat16"] = ""  # the KL reference model's weights; "" = dtype
    # GiB of activations one forward/backward may keep when micro_batch_tokens is auto (tirl.train.memory);
    # 0 = 1 GiB on a CPU (less where memory is short), a quarter of the GPU's memory on CUDA
    activation_gib: float = 0.0
    # the RL update's decoder layers through torch.compile (static shapes), its micro-batches' lengths padded up to
    # a multiple of compile_pad_multiple so that few shapes compile (tirl.train.compiled). Off by default: its
    # speed on a GPU is not measured
    compile_layers: bool = False
    compile_pad_multiple: int = 64
    lora: LoraConfig = field(default_factory=LoraConfig)  # rank > 0 trains a LoRA adapter (tirl.models.lora)

    def __post_init__(self) -> None:
        try:
            torch.device(self.device)
        except (RuntimeError, ValueError):
            raise ValueError(
                f"model.device={self.device!r} is not a torch device: use cpu, cuda, cuda:N (or mps)"
            ) from None
        if self.activation_gib < 0:
            raise ValueError(
                f"model.activation_gib must be >= 0 (0 = by the device), got {self.activation_gib}"
            )
        if self.compile_pad_multiple < 1:
            raise ValueError(f"model.compile_pad_multiple must be >= 1, got {self.compile_pad_multiple}")
        check_range("model.compile_pad_multiple", self.compile_pad_multiple, 1, MAX_TOKENS)
        if self.dtype not in DTYPES:
            raise ValueError(f"model.dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        if self.autocast not in AUTOCAST:
            raise ValueError(f"model.autocast must be one of {list(AUTOCAST)}, got {self.autocast!r}")
        if self.autocast == "bfloat16" and self.dtype != "float32":
            raise ValueError(
                f"model.autocast={self.autocast} needs model.dtype=float32 (autocast keeps float32 master weights); "
                f"with model.dtype={self.dtype} the weights are already low-precision: set model.autocast=none"
            )
        if self.ref_dtype not in ("", *DTYPES):
            raise ValueError(f"model.ref_dtype must be '' or one of {sorted(DTYPES)}, got {self.ref_dtype!r}")
        if self.lora.enabled and self.ref_dtype not in ("", self.dtype):
            raise ValueError(
                f"model.ref_dtype={self.ref_dtype} with LoRA: the KL reference is the policy's own frozen base "
                f"(adapter disabled), stored in model.dtype={self.dtype}; leave model.ref_dtype empty"
            )

    def autocast_dtype(self, hidden_size: int) -> torch.dtype | None:
        """The trainers' autocast dtype for a model of this width; `auto`: bfloat16 over float32 weights where it
        pays (`tirl.models.precision.bf16_pays`), else none."""
        if self.autocast == "auto":
            return torch.bfloat16 if self.dtype == "float32" and bf16_pays(self.device, hidden_size) else None
        return AUTOCAST[self.autocast]

    @property
    def reference_dtype(self) -> torch.dtype:
        return DTYPES[self.ref_dtype or self.dtype]


@dataclass
class TinyModelConfig:
    """Shape of the tiny Qwen2 model: the defaults (the demo's) give about 1.0M parameters with its ~600 tokens.

    Two wide layers learned to copy numbers several times sooner (in steps and seconds) than four narrow ones.
    """

    vocab_size: int = 1024  # the BPE target; a small corpus may yield fewer tokens
    hidden_size: int = 192
    intermediate_size: int = 576
    num_layers: int = 2
    num_heads: int = 6
    num_kv_heads: int = 6
    max_positions: int = 1024

    def __post_init__(self) -> None:
        check_counts(self, "demo.tiny", {  # a tiny model: far past these it is no longer one
            "vocab_size": (1, 1 << 20), "hidden_size": (1, 1 << 16), "intermediate_size": (1, 1 << 18),
            "num_layers": (1, 1024), "num_heads": (1, 1024), "num_kv_heads": (1, 1024), "max_positions": (1, MAX_TOKENS),
        })  # fmt: skip
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads {self.num_heads} is not divisible by num_kv_heads {self.num_kv_heads}"
            )
        if self.vocab_size < 300:
            raise ValueError(
                f"vocab_size {self.vocab_size} is below the 256 byte symbols plus special tokens"
            )
