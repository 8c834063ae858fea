"""Name -> function registries for the algorithm math (advantage estimators, policy losses), open to code outside tirl.

verl's core_algos registers its variants by name in dicts; this is the same, more strictly: one uniform signature
per kind, checked when a function is registered (not when a run first calls it, an hour in), a taken name raises
unless replaced on purpose, and an unknown name raises and lists the valid ones. The trainer looks its functions up
once at start-up. Not here: the functions themselves (`advantages`, `losses`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Mapping
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Mapping[str, T], Generic[T]):
    """A read-only mapping of registered items: `add` is the only way in, `lookup` the way out for a name a user
    gave (it raises ValueError listing the valid names where indexing raises KeyError)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind  # "advantage estimator", "policy loss": used in messages
        self._items: dict[str, T] = {}

    def add(self, name: str, item: T, *, replace: bool = False) -> T:
        if not isinstance(name, str) or not name:
            raise ValueError(f"a {self.kind} needs a non-empty name, got {name!r}")
        if name in self._items and not replace:
            raise ValueError(f"{self.kind} {name!r} is already registered (pass replace=True to override it)")
        self._items[name] = item
        return item

    def lookup(self, name: str) -> T:
        if name not in self._items:
            raise ValueError(f"unknown {self.kind} {name!r}; valid: {sorted(self._items)}")
        return self._items[name]

    def __getitem__(self, name: str) -> T:
        return self._items[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)


def check_signature(
    fn: Callable[..., object], kind: str, name: str, *, positional: int, keywords: tuple[str, ...] = ()
) -> frozenset[str]:
    """Raise unless `fn` takes exactly `positional` tensors positionally and only keyword-only hyperparameters
    after them, `keywords` among them; returns the names of its keyword-only parameters."""
    if not callable(fn):
        raise ValueError(f"{kind} {name!r}: {fn!r} is not callable")
    params = list(inspect.signature(fn).parameters.values())
    pos = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    kw = frozenset(p.name for p in params if p.kind == p.KEYWORD_ONLY)
    missing = [k for k in keywords if k not in kw]
    if len(pos) != positional or len(pos) + len(kw) != len(params) or missing:
        want = f"{positional} positional tensors, then keyword-only hyperparameters"
        raise ValueError(
            f"{kind} {name!r} has the signature {inspect.signature(fn)}; it needs {want}"
            + (f" including {', '.join(keywords)}" if keywords else "")
            + " (no *args or **kwargs)"
        )
    return kw
