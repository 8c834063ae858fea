"""Load any Hugging Face causal LM and its tokenizer from one `model.path`, and save checkpoints atomically."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tirl.io import atomic_dir

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class ModelConfig:
    path: str = ""  # a local Hugging Face model directory; the demo fills it with the tiny model it builds
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    attn_implementation: str = "sdpa"
    device: str = "cpu"
    # Recompute each decoder layer's activations in the backward pass instead of keeping them: less memory for
    # long responses at about one extra forward's cost. Off by default (the CPU demo's activations are small).
    gradient_checkpointing: bool = False

    def __post_init__(self) -> None:
        if self.dtype not in _DTYPES:
            raise ValueError(f"model.dtype must be one of {sorted(_DTYPES)}, got {self.dtype!r}")


def load_tokenizer(path: str | Path) -> Any:
    _check_path(path)
    return AutoTokenizer.from_pretrained(str(path))


def load_model(cfg: ModelConfig, path: str | Path | None = None) -> torch.nn.Module:
    """`path` overrides cfg.path (e.g. a checkpoint written by a previous stage)."""
    p = path or cfg.path
    _check_path(p)
    model = AutoModelForCausalLM.from_pretrained(
        str(p), dtype=_DTYPES[cfg.dtype], attn_implementation=cfg.attn_implementation
    )
    if cfg.gradient_checkpointing:
        enable_gradient_checkpointing(model)
    return model.to(cfg.device)


def enable_gradient_checkpointing(model: torch.nn.Module) -> None:
    """Non-reentrant checkpointing (works with frozen inputs and no_grad reference passes). Transformers only
    recomputes in train mode, so the engine's eval-mode generation keeps its KV cache."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.2x; the old name is deprecated
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def save_checkpoint(
    model: torch.nn.Module, tokenizer: Any, path: str | Path, *, extra: dict[str, Any] | None = None
) -> Path:
    """Model and tokenizer as a Hugging Face directory, written whole or not at all."""
    with atomic_dir(path) as stage:
        model.save_pretrained(stage)
        tokenizer.save_pretrained(stage)
        if extra:
            torch.save(extra, stage / "trainer_state.pt")
    return Path(path)


def _check_path(path: str | Path | None) -> None:
    if not path:
        raise ValueError("model.path is empty: set it to a local Hugging Face model directory")
    if not Path(path).is_dir():
        raise FileNotFoundError(
            f"model.path {str(path)!r} is not a directory (tirl loads local checkpoints only)"
        )
