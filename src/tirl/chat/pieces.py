"""A rendered conversation's unit: a text encoded on its own, and whether the loss trains on it.

Every chat format renders a conversation as a list of pieces; `tirl.chat.template.ChatRenderer` encodes them one
by one, which is what makes a conversation rendered turn by turn give the ids of the whole.

A piece may mark spans of its text as verbatim: text a program wrote (a tool's output), never markup. A special
token's text inside one (`<|im_end|>` printed by a snippet) is encoded as plain text (the tokenizer's
`split_special_tokens`), so no output can end a turn or open one in the context the model reads. A span without
such text is encoded as before, with the rest of its piece: the ids of every other output are the tokenizer's
encoding of the whole text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Piece:
    text: str
    trainable: bool  # the loss mask of its tokens: 1 on sampled assistant text and its end-of-turn token
    verbatim: tuple[tuple[int, int], ...] = ()  # (start, end) character spans of a tool's output


def special_texts(tokenizer: Any) -> set[str]:
    """The texts the tokenizer encodes as special tokens (turn markers, end of text) wherever they appear."""
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    found = {t.content for t in added.values() if getattr(t, "special", False)}
    return found | set(getattr(tokenizer, "all_special_tokens", None) or ())


def verbatim_parts(
    tokenizer: Any, text: str, spans: Sequence[tuple[int, int]]
) -> list[tuple[int, int, bool]]:
    """`text` cut into (start, end, split) parts: the verbatim spans that hold a special token's text
    (split: encode with special tokens as text), and the text around them; one part when no span holds any."""
    specials = special_texts(tokenizer) if spans else set()
    cuts = [(a, b) for a, b in sorted(spans) if any(s and s in text[a:b] for s in specials)]
    parts, at = [], 0
    for a, b in cuts:
        parts += [(at, a, False), (a, b, True)]
        at = b
    return [p for p in [*parts, (at, len(text), False)] if p[1] > p[0]]


def encode_piece(tokenizer: Any, piece: Piece) -> list[int]:
    """A piece's ids: the tokenizer's encoding of its text, special tokens written inside its verbatim spans
    encoded as text."""
    ids: list[int] = []
    for a, b, split in verbatim_parts(tokenizer, piece.text, piece.verbatim):
        kw = {"split_special_tokens": True} if split else {}
        ids += tokenizer.encode(piece.text[a:b], add_special_tokens=False, **kw)
    return ids
