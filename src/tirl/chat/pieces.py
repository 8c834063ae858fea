"""A rendered conversation's unit: a text encoded on its own, and whether the loss trains on it.

Every chat format renders a conversation as a list of pieces; `tirl.chat.template.ChatRenderer` encodes them one
by one, which is what makes a conversation rendered turn by turn give the ids of the whole.

A piece may mark spans of its text as verbatim: text a program wrote (a tool's output), never markup. A turn
marker's text inside one (`<|im_end|>` printed by a snippet: the chat formats' `<|im_start|>`/`<|im_end|>` and
the tokenizer's end-of-text, beginning and padding tokens, where it makes them special) is encoded as plain text
(the tokenizer's `split_special_tokens`), so no output can end a turn or open one in the context the model reads.
Other special tokens (tool-call and tool-response tags, which some tokenizers make special) are encoded as the
tokenizer encodes them: inside a tool turn they end no turn. A span without a turn marker is encoded as before,
with the rest of its piece: the ids of every other output are the tokenizer's encoding of the whole text.
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


TURN_MARKERS = ("<|im_start|>", "<|im_end|>")  # the chat formats' (tirl.chat.template)


def special_texts(tokenizer: Any) -> set[str]:
    """The turn markers the tokenizer encodes as special tokens wherever they appear: `TURN_MARKERS` and its
    end-of-text, beginning and padding tokens, each where it is special in this tokenizer."""
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    special = {t.content for t in added.values() if getattr(t, "special", False)}
    special |= set(getattr(tokenizer, "all_special_tokens", None) or ())
    named = {getattr(tokenizer, f"{k}_token", None) for k in ("eos", "bos", "pad")}
    return special & ({*TURN_MARKERS} | {t for t in named if isinstance(t, str) and t})


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
