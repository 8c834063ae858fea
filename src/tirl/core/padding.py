"""Where to cut rows into padded passes of similar lengths: one rule for the trainer's micro-batches
(`tirl.train.batch.micro_batches_by_length`) and the torch engine's pre-fill (`tirl.rollout.engines.torch.engine`), and its
variant for rows that share their prompts' passes (`shared_prefix_parts`), and which rows share (`first_rows`)."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator, Sequence

# What one more forward/backward pass costs beyond its tokens, in padded tokens: about 25 ms of fixed work (kernel
# launches, Python, the head's chunks) on the demo's 1M-parameter model on 2 cores, where a token costs ~0.1 ms.
PASS_COST_TOKENS = 256
MAX_PART_ROWS = 512  # bounds the search (rows x this); a larger pass would not be cheaper by much


def first_rows(keys: Sequence[Hashable | None]) -> tuple[list[int], list[int]]:
    """(src, inverse) for rows with `keys` (a prompt's tokens, say): `src` the first row of each distinct key (and
    every row whose key is None, shared with none), `inverse[i]` the position in `src` of the row that row i shares
    with. What the engine's pre-fill and the trainer's shared-prompt passes compute once."""
    first: dict[Hashable, int] = {}
    src: list[int] = []
    inverse: list[int] = []
    for i, key in enumerate(keys):
        if key is None or key not in first:
            if key is not None:
                first[key] = len(src)
            src.append(i)
            inverse.append(len(src) - 1)
        else:
            inverse.append(first[key])
    return src, inverse


def _cheapest_split(
    n: int, part_sizes: Callable[[int], Iterator[tuple[int, int]]], max_tokens: int, pass_cost: int
) -> list[int]:
    """The end index of each part of the cheapest cut of n ordered rows: `part_sizes(i)` yields (j, padded tokens
    of the part [j, i)) for j from i - 1 down; a part costs its size plus `pass_cost` and holds at most
    `max_tokens` (a row alone may exceed it). Dynamic programming over the cut points."""
    best, cut = [0] + [0] * n, [0] * (n + 1)
    for i in range(1, n + 1):
        best[i] = -1
        for j, size in part_sizes(i):
            if size > max_tokens and i - j > 1:
                break
            cost = best[j] + size + pass_cost
            if best[i] < 0 or cost < best[i]:
                best[i], cut[i] = cost, j
    ends, i = [], n
    while i > 0:
        ends.append(i)
        i = cut[i]
    return ends[::-1]


def _starts(i: int) -> range:
    """The first rows j of the parts that end at row i, nearest first, parts of at most MAX_PART_ROWS rows."""
    return range(i - 1, max(i - 1 - MAX_PART_ROWS, -1), -1)


def least_padding_split(
    lengths: Sequence[int], max_tokens: int, pass_cost: int = PASS_COST_TOKENS
) -> list[int]:
    """Where to cut ascending `lengths` into consecutive parts: the parts' padded tokens (count x longest) plus
    `pass_cost` per part, least in total, each part within `max_tokens` (a row longer than it alone). Returns the
    end index of each part."""
    return _cheapest_split(
        len(lengths), lambda i: ((j, lengths[i - 1] * (i - j)) for j in _starts(i)), max_tokens, pass_cost
    )


def least_padding_parts(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """The rows (indices into `lengths`, any order) in passes cut by `least_padding_split` over them sorted by
    length, each pass's rows back in their own order (one pass: every row, in order)."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    ends = least_padding_split([lengths[i] for i in order], max_tokens)
    return [sorted(order[a:b]) for a, b in zip([0, *ends[:-1]], ends, strict=True)]


def shared_prefix_parts(
    own: Sequence[int],
    keys: Sequence[int],
    prefix: Sequence[int],
    max_tokens: int,
    pass_cost: int = PASS_COST_TOKENS,
) -> list[list[int]]:
    """Rows whose first `prefix[i]` tokens are shared by every row of the same `keys[i]` (a GRPO group's prompt)
    and computed once per pass (`tirl.train.prefix`), followed by `own[i]` tokens of their own: passes that keep a
    key's rows together, cut where the padded tokens computed (distinct prefixes x the longest prefix + rows x the
    longest own part) plus `pass_cost` per pass are least, each within `max_tokens` (a row alone may exceed it).
    Each pass's rows come back in their own order."""
    order = sorted(range(len(own)), key=lambda i: (prefix[i], keys[i], own[i]))

    def part_sizes(i: int) -> Iterator[tuple[int, int]]:
        distinct, p_max, o_max, last_key = 0, 0, 0, None
        for j in _starts(i):
            r = order[j]
            if keys[r] != last_key:
                distinct, last_key = distinct + 1, keys[r]
            p_max, o_max = max(p_max, prefix[r]), max(o_max, own[r])
            yield j, distinct * p_max + (i - j) * o_max

    ends = _cheapest_split(len(order), part_sizes, max_tokens, pass_cost)
    return [sorted(order[a:b]) for a, b in zip([0, *ends[:-1]], ends, strict=True)]
