"""Plain Hugging Face model directories out of anything tirl trains: what vLLM, `tirl eval` or a hub upload load.

`export_hf(model, tokenizer, out_dir)` writes config, weights (`model.safetensors`) and tokenizer, written whole
or not at all. A LoRA model is written merged (base + scale * B A per adapted layer), computed into new tensors
so the live model, and its frozen base that serves as the KL reference, are left exactly as they were.
`export_checkpoint` does the same from a directory on disk or a Hub id (`tirl export CHECKPOINT --out DIR`;
`tirl.models.hub`): DIR is written
beside itself and renamed into place, and it must be new, empty or an earlier export (`tirl.core.rundir`), never a
directory holding the checkpoint or anything else, since a finished export replaces it whole, nor one inside the
checkpoint (whose manifest would then refuse it as changed). What an export killed midway staged beside DIR is
removed by the next export to DIR (`tirl.core.io.remove_stale_staging`). An earlier export
is replaced only while it holds nothing but the files that export wrote (listed in its marker): notes or an eval
added there since are named and the export is refused, before the model loads and again just before the rename.
A model whose weights hold a NaN or an infinity (a diverged run) is refused, naming the weight.

The model is whole (one process's): a model sharded over processes (FSDP) is gathered and written by the trainer's
side, `tirl.train.fsdp.save_model`, so this package never depends on the training one. Deliberately not here:
quantization, format conversion.
"""

from __future__ import annotations

import fnmatch
import os
from pathlib import Path
from typing import Any

import torch

from tirl.core import rundir
from tirl.core.io import atomic_dir, remove_stale_staging
from tirl.models import lora
from tirl.models.hub import resolve_model


def export_hf(model: torch.nn.Module, tokenizer: Any, out_dir: str | Path, *, command: str = "") -> Path:
    """Write the whole `model` (merged if it carries a LoRA adapter) and `tokenizer` as a plain HF directory at
    `out_dir`, marked as `command`'s output when given (`tirl.core.rundir`)."""
    with atomic_dir(out_dir) as stage:
        if lora.is_lora(model):
            base = model.get_base_model()
            base.save_pretrained(stage, state_dict=lora.merged_state_dict(model))
        else:
            model.save_pretrained(stage)
        if tokenizer is not None:
            tokenizer.save_pretrained(stage)
        if command:
            rundir.mark(stage, command, files=[p.name for p in stage.iterdir() if p.name != rundir.MARKER])
            refuse_foreign(out_dir)  # again: something may have been added while the model was written
    return Path(out_dir)


# what an export writes, for an export whose marker predates the list of its files
_HF_NAMES = (
    "config.json",
    "generation_config.json",
    "*.safetensors",
    "model.safetensors.index.json",
    "tokenizer*",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "vocab.*",
    "merges.txt",
    "SOURCE.txt",  # a model import's note of where it came from
)


def foreign_files(out_dir: str | Path) -> list[str]:
    """Names in an earlier export (or model import) at `out_dir` that it did not write (a user's notes, an eval's
    output)."""
    out = Path(out_dir)
    if not out.is_dir():
        return []
    recorded = rundir.recorded_files(out)

    def own(name: str) -> bool:
        if name in (rundir.MARKER, rundir.LOCK):
            return True
        return name in recorded if recorded is not None else any(fnmatch.fnmatch(name, p) for p in _HF_NAMES)

    return sorted(p.name for p in out.iterdir() if not own(p.name))


def refuse_foreign(out_dir: str | Path, command: str = "export") -> None:
    """Raise unless everything in `out_dir` is an earlier `command`'s own (`export`, `model import`: both replace
    their directory whole, and would delete the rest)."""
    foreign = foreign_files(out_dir)
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise rundir.RunDirError(
            f"--out {out_dir} is an earlier {command} that now also holds what the {command} did not write "
            f"({shown}); `tirl {command}` replaces its directory whole and would delete them: choose another "
            "--out, or move them out first"
        )


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
    """`tirl export`: the checkpoint at `path` (or a Hub id's cached snapshot) as a plain (merged) HF directory at
    `out_dir`."""
    path = resolve_model(path).path
    src, dst = Path(path).resolve(), Path(out_dir).resolve()
    if dst == src or dst in src.parents:
        raise ValueError(
            f"--out {out_dir} is the checkpoint itself or a directory holding it ({path}), and an export replaces "
            "--out whole: choose a directory outside it"
        )
    if src in dst.parents:
        raise ValueError(
            f"--out {out_dir} is inside the checkpoint {path}, which must hold only the files it was saved with "
            "(a resume would refuse it): choose a directory outside it"
        )
    out = Path(os.path.abspath(out_dir))  # where atomic_dir stages: beside --out as named, links not followed
    remove_stale_staging(out.parent, out.name)
    rundir.check_out(out_dir, "export")
    refuse_foreign(out_dir)
    model, tokenizer = load_exportable(path, base=base, dtype=dtype)
    refuse_non_finite(model, path)
    return export_hf(model, tokenizer, out_dir, command="export")


def refuse_non_finite(model: torch.nn.Module, path: str | Path) -> None:
    """Raise naming the first weight of `model` (loaded from `path`) that holds a NaN or an infinity: a model that
    went non-finite in training is not handed on as if it were one."""
    for name, t in model.state_dict().items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise ValueError(
                f"{path}: weight {name} holds NaN or infinite values, so it is not exported (the run diverged): "
                "export an earlier checkpoint"
            )
