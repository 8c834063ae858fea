"""A row too long for a token limit, refused by its characters before it is tokenized.

Tokenizing is what a huge row costs: a 20 MB row took `tirl sft` to 12.7 GB of memory before its token count was
compared with `sft.max_length`. Counting a row's characters costs nothing by comparison, and a row with more
characters than its token limit can hold is refused with that count, naming the row, before any tokenizer sees it.

The bound is `MAX_CHARS_PER_TOKEN` characters a token. The byte-level BPE vocabularies of the models tirl trains
(Qwen2.5, Qwen3, SmolLM2; GPT-2's and cl100k's lineage) encode prose, math and code at about 3 to 5 characters a
token: a conversation of `max_length` tokens averaging more than 32 characters each would have to be made almost
entirely of the longest pieces of the vocabulary (runs of spaces or of one punctuation mark). The count is
of every string in the row (its messages, tool calls and tools), so text a chat template leaves out (an earlier
turn's reasoning) counts too: the margin over the real ratio is what keeps such a row from being refused.

Deliberately not here: the exact token count (the tokenizer's, compared with the limit once the row passed this),
and reading the row (a line of the file is read whole before it is counted).
"""

from __future__ import annotations

from typing import Any

MAX_CHARS_PER_TOKEN = 32
# the token limit of the commands that read rows without a run's own (`data inspect`, `check-tokens`): the native
# context of Qwen2.5 and Qwen3, the longest rows tirl trains
READ_MAX_TOKENS = 32768


def text_chars(value: Any, stop_after: int | None = None) -> int:
    """The characters of every string in `value` (nested dicts and lists, keys included), counted without
    recursion; with `stop_after`, counting ends as soon as the total passes it."""
    total, stack = 0, [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            total += len(item)
            if stop_after is not None and total > stop_after:
                break
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return total


def check_row_chars(row: Any, max_tokens: int, *, where: str, key: str) -> None:
    """Raise ValueError naming `where` (the file and row) and `key` (the token limit's setting) if `row` has more
    characters than `max_tokens` tokens can hold at `MAX_CHARS_PER_TOKEN` characters a token; 0: no limit."""
    if max_tokens <= 0:
        return
    limit = max_tokens * MAX_CHARS_PER_TOKEN
    n = text_chars(row, stop_after=limit)
    if n > limit:
        raise ValueError(
            f"{where}: more than {limit} characters, which {key}={max_tokens} tokens cannot hold (at most "
            f"{MAX_CHARS_PER_TOKEN} characters a token; text averages 3 to 5): not tokenized; shorten or drop the "
            f"row, or raise {key}"
        )


__all__ = ["MAX_CHARS_PER_TOKEN", "READ_MAX_TOKENS", "check_row_chars", "text_chars"]
