"""The budget of one chat-template render (`tirl.chat.bounded_jinja`): the steps it spends, the text it
writes, and the size of what it builds, measured before it is built.

A step is about the time of the cheapest operation (a loop iteration); what costs more is charged more (a
lookup through the sandbox LOOKUP_STEPS, a macro MACRO_STEPS, a step per CHARS_PER_STEP characters of a string
handed to an operation, per item of a list, ITEM_STEPS per item a filter goes through). A size is measured
from the inputs (a repetition's length times its count, a replacement's hits times its growth, a format's
fields times its widest value and width, a container's printed length with a part held twice counted twice)
and refused past MAX_CHARS characters, MAX_ITEMS items or MAX_INT_BITS bits before the operation runs.
Deliberately not here: the Jinja environment and what it charges where (`tirl.chat.bounded_jinja`).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from typing import Any

from jinja2.utils import Namespace

MAX_STEPS = 1 << 21  # ~2M, about a second; Qwen3's template spends ~650 a message (100 measured)
MAX_CHARS = 1 << 24  # ~16.8M characters: a string built, and all a render writes
MAX_ITEMS = 1 << 20  # items of a list built; also the largest integer handed to a filter or a string method
MAX_INT_BITS = 1 << 16  # an integer built by * or ** (a number of ~20,000 digits)
CHARS_PER_STEP = 64
LOOKUP_STEPS = 8  # an attribute or item looked up through the sandbox
MACRO_STEPS = 16  # a macro called, or a recursive loop's loop(...)
ITEM_STEPS = 4  # an item of a list a filter goes through (sort, unique, map: Python code for each)
_DIGITS = re.compile(r"\d+")
_PERCENT_SPEC = re.compile(r"%[#0 +-]*(\*|\d+)?(?:\.(\*|\d+))?")  # printf's width and precision
_BRACE_FIELD = re.compile(r"\{[^{}]*(?:\{[^{}]*\}[^{}]*)*\}")  # a str.format field, a {width} nested in it


class TemplateBoundError(ValueError):
    """A chat template past one of this module's bounds."""


class Budget:
    """What one render has spent."""

    def __init__(self) -> None:
        self.steps = 0
        self.chars = 0

    def charge(self, steps: int) -> None:
        self.steps += steps
        if self.steps > MAX_STEPS:
            raise TemplateBoundError(
                f"the chat template takes more than {MAX_STEPS} steps (loop iterations, calls, filters) to "
                "render: a loop without a useful end?"
            )

    def write(self, chars: int) -> None:
        self.chars += chars
        refuse("text of", self.chars, MAX_CHARS, "characters")


_BUDGET: ContextVar[Budget | None] = ContextVar("tirl_template_budget", default=None)


def current_budget() -> Budget:
    return _BUDGET.get() or Budget()  # none outside a render: each operation is still bounded alone


@contextlib.contextmanager
def charged() -> Iterator[Budget]:
    """A fresh budget for the render (or the compile: filters of constants run then) inside the block."""
    token = _BUDGET.set(budget := Budget())
    try:
        yield budget
    finally:
        _BUDGET.reset(token)


def refuse(what: str, size: int, limit: int, unit: str) -> None:
    if size > limit:
        raise TemplateBoundError(
            f"the chat template builds {what} {size} {unit} or more, past the {limit} a template may build"
        )


def cost(x: Any) -> int:
    """Steps an operation on `x` is charged for its size."""
    if isinstance(x, str):
        return len(x) // CHARS_PER_STEP
    return len(x) if isinstance(x, list | tuple | dict | set | frozenset) else 0


def _parts(x: Any) -> Sequence[Any] | None:
    """What a container prints (a namespace prints its attributes); None for anything else."""
    if isinstance(x, Namespace):
        x = object.__getattribute__(x, "_Namespace__attrs")
    if isinstance(x, dict):
        return [*x.keys(), *x.values()]
    return list(x) if isinstance(x, list | tuple | set | frozenset) else None


def printed(x: Any, budget: Budget, memo: dict[int, tuple[int, int]] | None = None) -> tuple[int, int]:
    """(characters, nesting depth) of `str(x)` or `json.dumps(x)`, measured without building it: a part held
    twice counts twice, but is walked (and charged a step) once."""
    if isinstance(x, str):
        return len(x) + 2, 0
    if isinstance(x, bool | int):
        return x.bit_length() // 3 + 2, 0
    memo = {} if memo is None else memo
    if id(x) in memo:
        return memo[id(x)]
    parts = _parts(x)
    if parts is None:
        return 64, 0  # a number, None, a function or loop's repr
    memo[id(x)] = (8, 0)  # a container inside itself prints as [...]
    budget.charge(1 + len(parts))
    size, depth = 2 + 2 * len(parts), 0
    for part in parts:
        n, d = printed(part, budget, memo)
        size, depth = size + n, max(depth, d + 1)
        refuse("text of", size, MAX_CHARS, "characters")
    memo[id(x)] = (size, depth)
    return size, depth


def check_ints(args: Sequence[Any], kwargs: dict[str, Any]) -> None:
    """A width, count or repeat handed to a filter or string method, at most MAX_ITEMS."""
    for v in (*args, *kwargs.values()):
        if isinstance(v, int) and not isinstance(v, bool) and abs(v) > MAX_ITEMS:
            raise TemplateBoundError(
                f"the chat template passes {v} to a filter or string method, past the {MAX_ITEMS} a template "
                "may"
            )


def _format_size(fmt: str, values: Sequence[Any], budget: Budget) -> int:
    """At most the length of `fmt` formatted with `values` (`%` or str.format): each of its fields as wide as
    the widest value and the widest width its specs write (or take from `values`, with `*` or a nested
    field)."""
    memo: dict[int, tuple[int, int]] = {}
    widest = max([printed(v, budget, memo)[0] for v in values] + [0])
    fields, widths, passed = 0, [0], False
    for m in _PERCENT_SPEC.finditer(fmt):
        fields += 1
        passed |= "*" in m.groups()
        widths += [int(g) for g in m.groups() if g and g != "*"]
    for m in _BRACE_FIELD.finditer(fmt):
        fields += 1
        spec = m.group()[1:-1].partition(":")[2]
        passed |= "{" in spec
        widths += [int(d) for d in _DIGITS.findall(spec)]
    if passed:
        widths += [abs(v) for v in values if isinstance(v, int)]
    return len(fmt) + fields * (widest + max(widths))


def _replace_size(s: str, old: str, new: str, count: Any = -1) -> int:
    hits = len(s) + 1 if old == "" else s.count(old)
    if isinstance(count, int) and count >= 0:
        hits = min(hits, count)
    return len(s) + hits * max(len(new) - len(old), 0)


def binop_size(op: str, left: Any, right: Any, budget: Budget) -> None:
    """Refuse the result of an intercepted operator before it is built, where it would pass a bound."""
    seq, n = (left, right) if isinstance(right, int) else (right, left)
    if op == "*" and isinstance(n, int) and isinstance(seq, str | list | tuple):
        limit, unit = (MAX_CHARS, "characters") if isinstance(seq, str) else (MAX_ITEMS, "items")
        refuse("a repetition of", len(seq) * max(n, 0), limit, unit)
    elif op == "*" and isinstance(left, int) and isinstance(right, int):
        refuse("a product of", left.bit_length() + right.bit_length(), MAX_INT_BITS, "bits")
    elif op == "**" and isinstance(left, int) and isinstance(right, int) and abs(left) > 1 and right > 0:
        refuse("a power of", left.bit_length() * right, MAX_INT_BITS, "bits")
    elif op == "+" and isinstance(left, str) and isinstance(right, str):
        refuse("a string of", len(left) + len(right), MAX_CHARS, "characters")
    elif op == "+" and isinstance(left, list | tuple) and isinstance(right, list | tuple):
        refuse("a list of", len(left) + len(right), MAX_ITEMS, "items")
    elif op == "%" and isinstance(left, str):
        values = right if isinstance(right, tuple) else [right]
        refuse("a formatted string of", _format_size(left, values, budget), MAX_CHARS, "characters")


def built(result: Any) -> Any:
    """A call's or filter's result, refused past the bounds (for what could not be measured before)."""
    if isinstance(result, str):
        refuse("a string of", len(result), MAX_CHARS, "characters")
    elif isinstance(result, list | tuple | dict):
        refuse("a list of", len(result), MAX_ITEMS, "items")
    return result


def string_method(name: str, s: str, args: tuple[Any, ...], kwargs: dict[str, Any], budget: Budget) -> tuple:
    """Check a string method's result size before it runs; its arguments (a join's items made a list)."""
    check_ints(args, kwargs)
    if name == "replace" and len(args) >= 2:
        size = _replace_size(
            s, str(args[0]), str(args[1]), args[2] if len(args) > 2 else kwargs.get("count", -1)
        )
        refuse("a string of", size, MAX_CHARS, "characters")
    elif name == "expandtabs":
        tab = args[0] if args else kwargs.get("tabsize", 8)
        refuse("a string of", len(s) + s.count("\t") * max(int(tab), 0), MAX_CHARS, "characters")
    elif name == "join" and args:
        items = list(args[0])
        budget.charge(len(items))
        size = sum(len(i) if isinstance(i, str) else 0 for i in items) + len(s) * len(items)
        refuse("a string of", size, MAX_CHARS, "characters")
        args = (items, *args[1:])
    elif name in ("format", "format_map"):
        mapping = args[0] if name == "format_map" and args and isinstance(args[0], dict) else {}
        values = [*args, *kwargs.values(), *mapping.values()]
        refuse("a formatted string of", _format_size(s, values, budget), MAX_CHARS, "characters")
    return args


def _arg(args: Sequence[Any], kwargs: dict[str, Any], i: int, name: str, default: Any = None) -> Any:
    return args[i] if len(args) > i else kwargs.get(name, default)


def filter_size(name: str, value: Any, args: tuple, kwargs: dict[str, Any], budget: Budget) -> Any:
    """Check filter `name`'s result size before it runs; return its value (a list where it is iterated
    twice)."""
    if name == "replace":
        size = _replace_size(str(value), str(_arg(args, kwargs, 0, "old")), str(_arg(args, kwargs, 1, "new")),
                             _arg(args, kwargs, 2, "count", -1))  # fmt: skip
        refuse("a string of", size, MAX_CHARS, "characters")
    elif name == "indent":
        width, s = _arg(args, kwargs, 0, "width", 4), str(value)
        pad = width if isinstance(width, int) else len(str(width))
        refuse("a string of", len(s) + (s.count("\n") + 1) * pad, MAX_CHARS, "characters")
    elif name == "wordwrap":
        width, wrap, s = _arg(args, kwargs, 0, "width", 79), _arg(args, kwargs, 2, "wrapstring"), str(value)
        lines = s.count("\n") + 1 + len(s) // max(int(width), 1)
        refuse("a string of", len(s) + lines * len(str(wrap or "\n")), MAX_CHARS, "characters")
    elif name == "join":
        value = list(value)
        memo: dict[int, tuple[int, int]] = {}
        glue = len(str(_arg(args, kwargs, 0, "d", ""))) * len(value)
        refuse("a string of", glue + sum(printed(v, budget, memo)[0] for v in value), MAX_CHARS, "characters")
    elif name == "format":
        size = _format_size(str(value), [*args, *kwargs.values()], budget)
        refuse("a formatted string of", size, MAX_CHARS, "characters")
    elif name == "sum":
        value = list(value)
        start = _arg(args, kwargs, 1, "start", 0)
        items = sum(len(v) for v in (start, *value) if isinstance(v, list | tuple))
        refuse("a list of", items, MAX_ITEMS, "items")
        budget.charge(len(value) * items // (2 * CHARS_PER_STEP))  # each list + list copies: quadratic
    return value
