"""A rendered conversation's unit: a text encoded on its own, and whether the loss trains on it.

Every chat format renders a conversation as a list of pieces; `tirl.chat.template.ChatRenderer` encodes them one
by one, which is what makes a conversation rendered turn by turn give the ids of the whole.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Piece:
    text: str
    trainable: bool  # the loss mask of its tokens: 1 on sampled assistant text and its end-of-turn token
