"""Plain Hugging Face model directories out of anything tirl trains: what vLLM, `tirl eval` or a hub upload load.

`export_hf(model, tokenizer, out_dir)` writes config, weights (`model.safetensors`) and tokenizer, written whole
or not at all. A LoRA model is written merged (base + scale * B A per adapted layer), computed into new tensors
so the live model, and its frozen base that serves as the KL reference, are left exactly as they were.
`export_checkpoint` does the same from a directory on disk (`tirl export CHECKPOINT --out DIR`): DIR is written
beside itself and renamed into place, and it must be new, empty or an earlier export (`tirl.rundir`), never a
directory holding the checkpoint or anything else, since a finished export replaces it whole.

The model is whole (one process's): a model sharded over processes (FSDP) is gathered and written by the trainer's
side, `tirl.train.fsdp.save_model`, so this package never depends on the training one. Deliberately not here:
quantization, format conversion.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from tirl import rundir
from tirl.io import atomic_dir
from tirl.models import lora


def export_hf(model: torch.nn.Module, tokenizer: Any, out_dir: str | Path, *, command: str = "") -> Path:
    """Write the whole `model` (merged if it carries a LoRA adapter) and `tokenizer` as a plain HF directory at
    `out_dir`, marked as `command`'s output when given (`tirl.rundir`)."""
    with atomic_dir(out_dir) as stage:
        if lora.is_lora(model):
            base = model.get_base_model()
            base.save_pretrained(stage, state_dict=lora.merged_state_dict(model))
        else:
            model.save_pretrained(stage)
        if tokenizer is not None:
            tokenizer.save_pretrained(stage)
        if command:
            rundir.mark(stage, command)
    return Path(out_dir)


def load_exportable(path: str | Path, *, base: str | Path | None = None, dtype: str = "float32") -> Any:
    """(model, tokenizer) of a tirl model directory: a LoRA adapter (its recorded base + the adapter; `base`
    overrides the recorded base path) or a full model (final `model/` or a `checkpoint-<k>/`)."""
    from tirl.models.loading import ModelConfig, load_model, load_tokenizer

    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: no such directory")
    if lora.is_adapter_dir(path):
        base_dir = lora.recorded_base(path, base)
        model = lora.load_adapter(load_model(ModelConfig(path=base_dir, dtype=dtype)), path)
    elif (path / "config.json").is_file() and any(path.glob("*.safetensors")):
        model = load_model(ModelConfig(path=str(path), dtype=dtype))
    else:
        raise ValueError(
            f"{path} is not a model checkpoint: it has neither {lora.ADAPTER_CONFIG} (a LoRA adapter) nor "
            "config.json with *.safetensors weights (a full model)"
        )
    tok_dir = path if (path / "tokenizer_config.json").is_file() else lora.recorded_base(path, base)
    return model.eval(), load_tokenizer(tok_dir)


def export_checkpoint(
    path: str | Path, out_dir: str | Path, *, base: str | Path | None = None, dtype: str = "float32"
) -> Path:
    """`tirl export`: the checkpoint at `path` as a plain (merged) HF directory at `out_dir`."""
    src, dst = Path(path).resolve(), Path(out_dir).resolve()
    if dst == src or dst in src.parents:
        raise ValueError(
            f"--out {out_dir} is the checkpoint itself or a directory holding it ({path}), and an export replaces "
            "--out whole: choose a directory outside it"
        )
    rundir.check_out(out_dir, "export")
    model, tokenizer = load_exportable(path, base=base, dtype=dtype)
    return export_hf(model, tokenizer, out_dir, command="export")
