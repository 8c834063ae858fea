"""LoRA adapters (with `peft`): train a low-rank update of the linear layers while the base weights stay frozen.

What LoRA changes elsewhere, and where:
- the optimizer only sees the adapter (`build_optimizer` takes parameters with `requires_grad`);
- the KL reference is the policy's own base with the adapter disabled (`tirl.train.rl.reference`): no second copy;
- a saved model or checkpoint holds the adapter (`adapter_model.safetensors`, `adapter_config.json`) and
  `base_model.json`, which records the base's absolute path and a fingerprint that resuming, evaluation and
  `tirl export` check before loading the adapter onto it;
- `tirl.models.export.export_hf` writes the merged weights as a plain Hugging Face directory.

Deliberately not here: several adapters per model, quantized bases (QLoRA), DoRA and other peft variants.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from tirl.core.errors import TirlError
from tirl.models.config import ALL_LINEAR, LoraConfig

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
BASE_RECORD = "base_model.json"


class LoraError(TirlError):
    """A LoRA adapter does not fit its base model, or the base it was trained on is missing or has changed."""


def is_lora(model: torch.nn.Module) -> bool:
    from peft import PeftModel

    return isinstance(model, PeftModel)


def linear_names(model: torch.nn.Module) -> list[str]:
    """The distinct last names of the model's linear layers (what `target_modules` may name)."""
    return sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)})


def apply_lora(model: torch.nn.Module, cfg: LoraConfig) -> torch.nn.Module:
    """Wrap `model` with a fresh trainable adapter (B = 0, so the wrapped model computes exactly the base's
    function); every base parameter is frozen."""
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    names = {n.rsplit(".", 1)[-1] for n, _ in model.named_modules()}
    unknown = [t for t in cfg.target_modules if t != ALL_LINEAR and t not in names]
    if unknown:
        raise ValueError(
            f"model.lora.target_modules: {unknown} name no module of this model; its linear layers are "
            f"{linear_names(model)} (or use ['all-linear'])"
        )
    targets: Any = ALL_LINEAR if cfg.target_modules == [ALL_LINEAR] else list(cfg.target_modules)
    peft_cfg = PeftLoraConfig(
        r=cfg.rank,
        lora_alpha=cfg.alpha,
        lora_dropout=cfg.dropout,
        target_modules=targets,
        task_type="CAUSAL_LM",
    )
    with _quiet_peft():
        return get_peft_model(model, peft_cfg)


@contextlib.contextmanager
def _quiet_peft() -> Iterator[None]:
    """peft asks transformers for a deprecated attribute name: a warning that is not the user's to fix."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        yield


def parameter_counts(model: torch.nn.Module) -> tuple[int, int]:
    """(trainable, total) parameter counts."""
    params = list(model.parameters())
    return sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params)


def is_adapter_dir(path: str | Path) -> bool:
    return (Path(path) / ADAPTER_CONFIG).is_file()


def base_fingerprint(path: str | Path) -> dict[str, Any]:
    """A cheap identity of a base model directory: its config's hash and its weight files' sizes (hashing
    gigabytes of weights on every resume would cost minutes)."""
    path = Path(path)
    config = path / "config.json"
    if not config.is_file():
        raise LoraError(f"base model {path}: no config.json (not a Hugging Face model directory)")
    weights = sorted(path.glob("*.safetensors")) + sorted(path.glob("*.bin"))
    return {
        "config_sha256": hashlib.sha256(config.read_bytes()).hexdigest(),
        "weights": {f.name: f.stat().st_size for f in weights},
    }


def save_model(
    model: torch.nn.Module, directory: str | Path, *, state_dict: dict[str, torch.Tensor] | None = None
) -> None:
    """`model.save_pretrained`, plus the base's record for an adapter. A merged copy is `export_hf`'s job.

    `state_dict`: the weights to write instead of the model's own (those gathered from an FSDP-sharded model)."""
    directory = Path(directory)
    model.save_pretrained(directory, **({"state_dict": state_dict} if state_dict is not None else {}))
    if is_lora(model):
        base = base_path(model)
        record = {"path": base, "fingerprint": base_fingerprint(base)}
        (directory / BASE_RECORD).write_text(json.dumps(record, indent=1))


def base_path(model: torch.nn.Module) -> str:
    """The absolute directory the LoRA model's base was loaded from (`load_model` resolves it)."""
    path = getattr(model.get_base_model().config, "_name_or_path", "") or ""
    if not path or not Path(path).is_dir():
        raise LoraError(
            f"the LoRA model's base was not loaded from a local directory ({path!r}); load it with "
            "tirl.models.loading.load_model so that its adapter can be saved with a base to resume from"
        )
    return str(Path(path).resolve())


def recorded_base(adapter_dir: str | Path, base: str | Path | None = None) -> str:
    """The base model directory an adapter was trained on (`base` overrides the recorded path), checked against
    the recorded fingerprint; raises `LoraError` naming what differs."""
    adapter_dir = Path(adapter_dir)
    record_file = adapter_dir / BASE_RECORD
    if not record_file.is_file():
        raise LoraError(
            f"{adapter_dir}: no {BASE_RECORD} (an adapter not written by tirl?); cannot find its base"
        )
    record = json.loads(record_file.read_text())
    path = Path(base or record["path"])
    if not path.is_dir():
        raise LoraError(
            f"{adapter_dir}: its base model {str(path)!r} is not a directory (moved or deleted?); "
            "pass the base's new location"
        )
    if base_fingerprint(path) != record["fingerprint"]:
        raise LoraError(
            f"{adapter_dir}: the base model at {path} is not the one this adapter was trained on "
            f"(config or weight files differ from {BASE_RECORD})"
        )
    return str(path.resolve())


def check_same_base(model: torch.nn.Module, adapter_dir: str | Path) -> None:
    """Resuming: the adapter in `adapter_dir` must have been trained on the base `model` was built from."""
    recorded = recorded_base(adapter_dir)
    if recorded != base_path(model):
        raise LoraError(
            f"checkpoint {adapter_dir} holds an adapter of the base {recorded!r}, but this run's base is "
            f"{base_path(model)!r}: resume with the model.path the run started from"
        )


def load_adapter_weights(model: torch.nn.Module, adapter_dir: str | Path) -> None:
    """Put a saved adapter's weights into a LoRA model of the same shape, in place (resuming)."""
    from peft.utils import set_peft_model_state_dict
    from safetensors.torch import load_file

    adapter_dir = Path(adapter_dir)
    if not is_lora(model):
        raise LoraError(
            f"{adapter_dir} holds a LoRA adapter but the model has none: set model.lora.rank as the run did"
        )
    weights = adapter_dir / ADAPTER_WEIGHTS
    if not weights.is_file():
        raise LoraError(
            f"{adapter_dir}: no {ADAPTER_WEIGHTS}; it is not a LoRA checkpoint (the run trained with LoRA)"
        )
    saved = json.loads((adapter_dir / ADAPTER_CONFIG).read_text())
    live = model.peft_config["default"]
    if (saved.get("r"), saved.get("lora_alpha")) != (live.r, live.lora_alpha):
        raise LoraError(
            f"{adapter_dir}: adapter rank/alpha {saved.get('r')}/{saved.get('lora_alpha')} differ from "
            f"model.lora's {live.r}/{live.lora_alpha}"
        )
    check_same_base(model, adapter_dir)
    state = load_file(weights)
    result = set_peft_model_state_dict(model, state)
    expected = {n for n, p in model.named_parameters() if p.requires_grad}
    missing = sorted(k for k in result.missing_keys if k in expected)
    if missing or result.unexpected_keys:
        raise LoraError(
            f"{adapter_dir}: the adapter does not fit the model (missing {missing[:5]}, "
            f"unexpected {list(result.unexpected_keys)[:5]}); check model.lora.target_modules"
        )


def load_adapter(
    base: torch.nn.Module, adapter_dir: str | Path, *, trainable: bool = False
) -> torch.nn.Module:
    """`base` (already loaded from the recorded base directory) with the saved adapter on top."""
    from peft import PeftModel

    with _quiet_peft():
        return PeftModel.from_pretrained(base, str(adapter_dir), is_trainable=trainable)


def merged_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The base model's state dict with every adapter folded in (W + scale * B A), under the plain model's names.

    The live model is not touched: merged weights are new tensors, so the frozen base (the KL reference) stays
    bit-identical, which merging in place and unmerging would not guarantee (W + BA - BA != W in floating point).
    """
    from peft.tuners.lora import LoraLayer

    inner = model.get_base_model()
    adapter = model.active_adapter
    out: dict[str, torch.Tensor] = {}
    merged: dict[str, torch.Tensor] = {}
    for name, module in inner.named_modules():
        if isinstance(module, LoraLayer) and adapter in module.lora_A:
            base = module.get_base_layer()
            merged[f"{name}.weight"] = (base.weight + module.get_delta_weight(adapter)).detach()
    for key, value in inner.state_dict().items():
        if ".lora_" in key:
            continue
        plain = key.replace(".base_layer.", ".")
        out[plain] = merged.get(plain, value).detach()
    return out
