"""The bounds a config's values must lie in, and the checks that refuse the rest naming the setting.

Every count a config sets has an upper bound here (`check_counts`), far above what a real run uses: a value past
one is refused as the config loads, naming its key, where it would otherwise allocate until the machine runs out
of memory (`eval.n=1000000000` did) or spawn without end. `check_range` refuses NaN and infinities too (NaN
compares false with everything, so `if value < 0` alone lets it through), and `check_product` bounds what is held
at once. Values repeated in a message are shortened (`shown`). The loader itself is `tirl.core.config`.
"""

from __future__ import annotations

import math
import reprlib
from collections.abc import Mapping, Sequence
from typing import Any

MAX_SHOWN_CHARS = 200  # of a value repeated in an error message

# Upper bounds of the counts a config sets (`check_counts`); the recipes' own values are in
# src/tirl/configs/recipe-*.yaml.
MAX_TOKENS = 1 << 20  # a sequence, prompt, response or turn: 8x the longest context of the models tirl trains
MAX_BATCH_TOKENS = 1 << 26  # padded tokens per forward/backward (the recipe: 23,040)
MAX_COUNT = 1 << 16  # samples per problem, problems or sequences of a batch, turns, calls (pass@k: ~10,000)
MAX_IN_FLIGHT = 1 << 16  # trajectories held at once: samples x problems (the recipe: 16 x 64 = 1,024)
MAX_STEPS = 10**7  # optimizer steps, epochs, steps between saves or validations (the recipe: 1,410 steps)
MAX_ROWS = 1 << 20  # rows a task generates or draws
MAX_PROCESSES = 4096  # worker processes or threads: above the core count of any one machine
MAX_CHARS = 1 << 26  # characters of one tool response kept
MAX_RETRIES = 100


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxtuple, _REPR.maxdict = 3, 8, 8, 8
_REPR.maxstring = _REPR.maxother = _REPR.maxlong = MAX_SHOWN_CHARS


def shown(value: Any) -> str:
    """`repr(value)` shortened to about `MAX_SHOWN_CHARS` characters (a huge value would flood the message)."""
    text = _REPR.repr(value)
    return text if len(text) <= MAX_SHOWN_CHARS else text[: MAX_SHOWN_CHARS - 3] + "..."


def check_range(
    name: str,
    value: float,
    low: float | None = None,
    high: float | None = None,
    *,
    low_open: bool = False,
    high_open: bool = False,
    low_name: str = "",
) -> None:
    """Raise ValueError unless `value` is finite and within [low, high] (open ends where asked; `low_name`: the
    setting `low` comes from). NaN compares false with everything, so `if value < 0` alone lets it through, to
    fail minutes later in the loss."""
    # an int is finite, even one past a float's range (where math.isfinite would raise OverflowError)
    ok = isinstance(value, int) or math.isfinite(value)
    ok = ok and (low is None or (value > low if low_open else value >= low))
    ok = ok and (high is None or (value < high if high_open else value <= high))
    if not ok:
        bound = f"{low_name} ({low})" if low_name else f"{low}"
        lo = "" if low is None else f"{bound} {'<' if low_open else '<='} "
        hi = "" if high is None else f" {'<' if high_open else '<='} {high}"
        what, text = ("an integer", shown(value)) if isinstance(value, int) else ("a finite number", value)
        raise ValueError(f"{name}={text} must be {what}{' with ' + lo + name + hi if lo or hi else ''}")


def check_counts(obj: Any, section: str, bounds: Mapping[str, tuple[int, int]]) -> None:
    """`check_range` for each integer field of `obj` that `bounds` names, within its (low, high), named
    `section.field` in the error (a field that is not an int, such as `micro_batch_tokens: auto`, is skipped)."""
    for name, (low, high) in bounds.items():
        value = getattr(obj, name)
        if isinstance(value, int) and not isinstance(value, bool):
            check_range(f"{section}.{name}" if section else name, value, low, high)


def check_product(names: Sequence[str], values: Sequence[int], high: int, what: str, fix: str) -> None:
    """Raise unless the product of `values` (of the settings `names`) is at most `high`; `what` the product counts,
    `fix` what to lower."""
    product = math.prod(values)
    if product > high:
        raise ValueError(
            f"{' x '.join(f'{n}={v}' for n, v in zip(names, values, strict=True))} = {product} {what}: at most "
            f"{high}; {fix}"
        )
