"""Load any Hugging Face causal LM and its tokenizer from one `model.path`, and save checkpoints atomically.

Precision options (`model.dtype`, `model.autocast`, `model.ref_dtype`) and why (docs/configuration.md, "Memory
options and LoRA"):
- `autocast: bfloat16` keeps float32 weights (the "master" copy AdamW updates, with float32 moments) and runs the
  trainer's forward and backward under `torch.autocast`; log-softmax is taken in float32 on chunked logits
  (`tirl.train.logprobs`). This is the safe choice on GPUs: bf16's 8-bit mantissa cannot hold an update smaller
  than 1/256 of a weight, so pure-bf16 AdamW silently drops many small late-training updates.
- `autocast: auto` (the default) is `bfloat16` where it pays: the device multiplies bf16 natively (a GPU; a CPU
  with AVX512-BF16 or AMX) and the model is wide enough for its matmuls to outweigh the casts
  (`tirl.models.precision`); `none` elsewhere.
- `dtype: bfloat16` stores the weights (and so AdamW's moments) in bf16: half the memory, with the loss of small
  updates above; for memory-bound runs where that is acceptable.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tirl.core.config import ConfigError
from tirl.core.io import atomic_dir
from tirl.models.config import DTYPES, ModelConfig
from tirl.models.hub import resolve_model
from tirl.models.lora import apply_lora, is_adapter_dir, load_adapter, recorded_base, save_model


def check_device(device: str) -> None:
    """Refuse a `model.device` this machine's PyTorch cannot use, before a model loads or a file is written (not
    in `__post_init__`: `tirl plan` reads a GPU run's config on a machine without one)."""
    where = torch.device(device)
    if where.type == "cuda":
        if not torch.cuda.is_available():
            why = (
                "no CUDA GPU is visible"
                if torch.backends.cuda.is_built()
                else "this PyTorch is built without CUDA"
            )
            raise ConfigError(
                f"model.device={device}: {why}; run on a machine with one, or set model.device=cpu"
            )
        if where.index is not None and where.index >= torch.cuda.device_count():
            raise ConfigError(
                f"model.device={device}: this machine has {torch.cuda.device_count()} CUDA GPU(s), "
                f"cuda:0 to cuda:{torch.cuda.device_count() - 1}"
            )
    elif where.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"model.device={device}: MPS is not available here; set model.device=cpu")
    elif where.type not in ("cpu", "cuda", "mps"):
        raise ConfigError(f"model.device={device}: tirl runs on cpu, cuda or mps, not {where.type}")


def load_tokenizer(path: str | Path) -> Any:
    """The tokenizer of a model directory or Hub id (`model_dir`)."""
    path = model_dir(path, _TOKENIZER_FILES)
    if not _has_any(path, TOKENIZER_PATTERNS):
        raise FileNotFoundError(_incomplete(path))
    with _unreadable(path, "tokenizer"):
        return AutoTokenizer.from_pretrained(str(path))


@contextlib.contextmanager
def _unreadable(path: str | Path, what: str) -> Iterator[None]:
    """Around transformers' loading of the model directory `path`: a file it cannot read (config.json that is not
    JSON or nested too deeply, weights truncated or not safetensors) is a ValueError naming the directory, not a
    traceback; the file system's own errors (an errno: permissions, I/O) pass as they are."""
    from safetensors import SafetensorError

    try:
        yield
    except (OSError, RecursionError, SafetensorError) as e:
        if isinstance(e, OSError) and e.errno is not None:
            raise
        why = "a file is nested too deeply to read" if isinstance(e, RecursionError) else str(e)
        if isinstance(e, SafetensorError):
            why += " (a weights file truncated, or not safetensors)"
        raise ValueError(f"model.path {str(path)!r}: its {what} cannot be loaded: {why}") from e


def load_model(cfg: ModelConfig, path: str | Path | None = None) -> torch.nn.Module:
    """`path` overrides cfg.path (e.g. a checkpoint written by a previous stage); either may be a Hub id."""
    p = model_dir(path or cfg.path)
    if is_adapter_dir(p):
        raise ValueError(
            f"{p} is a LoRA adapter, not a full model: `tirl export {p} --out DIR` writes it merged into its "
            "base, then use DIR"
        )
    if not _has_any(p, WEIGHT_PATTERNS):
        raise FileNotFoundError(_incomplete(p))
    # the absolute path, so that an adapter trained on this model records where its base lives
    with _unreadable(p, "model"):
        model = AutoModelForCausalLM.from_pretrained(
            str(Path(p).resolve()), dtype=DTYPES[cfg.dtype], attn_implementation=cfg.attn_implementation
        )
    if cfg.gradient_checkpointing:
        enable_gradient_checkpointing(model)
    return model.to(cfg.device)


def load_policy(cfg: ModelConfig, path: str | Path | None = None) -> torch.nn.Module:
    """The model a trainer updates: `load_model`, wrapped with a fresh LoRA adapter when `model.lora.rank > 0`.

    A LoRA adapter directory as the starting point (a previous LoRA stage's output) is refused by `load_model`:
    its merged export is a real base that checkpoints, resuming and `tirl export` can point to."""
    model = load_model(cfg, path)
    if cfg.lora.enabled:
        model = apply_lora(model, cfg.lora)  # non-reentrant checkpointing needs no input that requires grad
    return model


def load_for_inference(cfg: ModelConfig, path: str | Path | None = None) -> torch.nn.Module:
    """A full model, or a LoRA adapter directory loaded onto its recorded base and merged (faster to sample)."""
    p = model_dir(path or cfg.path)
    if is_adapter_dir(p):
        base = load_model(dataclasses.replace(cfg, path=recorded_base(p)))
        return load_adapter(base, p).merge_and_unload().eval()
    return load_model(cfg, p).eval()


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
        save_model(model, stage)  # a LoRA model: the adapter and its base's record
        tokenizer.save_pretrained(stage)
        if extra:
            torch.save(extra, stage / "trainer_state.pt")
    return Path(path)


_MODEL_FILES = ("config.json", "adapter_config.json")  # a model, or a LoRA adapter on its recorded base
_TOKENIZER_FILES = (*_MODEL_FILES, "tokenizer_config.json", "tokenizer.json")


# what save_pretrained writes for a tokenizer (fast, or a slow one's vocabulary) and for the weights
TOKENIZER_PATTERNS = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt")
WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin", "model.safetensors.index.json")


def _has_any(path: str | Path, patterns: tuple[str, ...]) -> bool:
    return any(next(Path(path).glob(p), None) is not None for p in patterns)


def _incomplete(path: str | Path) -> str:
    """What a model directory lacks (its tokenizer, its weights), said before a backend guesses at the cause."""
    missing = [
        f"no {what} (expected one of {', '.join(patterns)})"
        for what, patterns in (("tokenizer files", TOKENIZER_PATTERNS), ("weights", WEIGHT_PATTERNS))
        if not _has_any(path, patterns)
    ]
    return (
        f"model.path {str(path)!r} is an incomplete Hugging Face model directory: it has {' and '.join(missing)}; "
        "point model.path at a directory that save_pretrained wrote whole (config.json, weights and tokenizer)"
    )


def model_dir(path: str | Path | None, needs: tuple[str, ...] = _MODEL_FILES) -> Path:
    """The one place a `model.path` becomes a directory: a local one as given, or a Hub id's cached snapshot
    (`tirl.models.hub`, fetched first where allowed); it must hold one of `needs`, else an error names the path
    (not a backend's traceback)."""
    if not path:
        raise ValueError("model.path is empty: set it to a Hugging Face model directory or Hub id (org/name)")
    resolved = resolve_model(path)
    where = f"{str(path)!r}" + (f" (cached at {resolved.path})" if resolved.from_hub else "")
    if not resolved.path.is_dir():
        raise FileNotFoundError(
            f"model.path {where} is not a directory, nor a Hugging Face Hub id (org/name or org/name@revision)"
        )
    if not any((resolved.path / f).is_file() for f in needs):
        raise FileNotFoundError(
            f"model.path {where} has no config.json: not a Hugging Face model directory (one that "
            "save_pretrained writes, with config.json, weights and tokenizer; a .gguf file: `tirl model import`)"
        )
    return resolved.path


def tied_aliases(model: torch.nn.Module) -> set[str]:
    """Names under which an already-named parameter appears again (a tied LM head): saved or sent once, as a plain
    `save_pretrained` does."""
    seen: set[int] = set()
    out = set()
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in seen:
            out.add(name)
        seen.add(id(p))
    return out


def cache_keyword(model: torch.nn.Module) -> str:
    """The forward argument that takes the KV cache: `cache` in newer transformers (which warns on every call given
    the older name), `past_key_values` before; a PEFT model is asked through the model it wraps."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    params = inspect.signature(type(inner).forward).parameters
    return "cache" if "cache" in params else "past_key_values"
