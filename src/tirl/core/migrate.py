"""Older config files in the current keys: what `tirl config migrate` does to a loaded mapping.

Each section's `MOVED_KEYS` (`tirl.core.config`) names where a renamed key went; `migrate_data` moves every such key
of a file there, drops a moved key the new place does not have (a setting of another variant), and writes out what
a key the file left out meant (`MOVED_DEFAULTS`) where the new place's default differs, so the migrated file runs as
the old one did. Deliberately not here: reading or writing files (`tirl.commands.config`), or any knowledge of a
particular section: every rule comes from the dataclasses.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from typing import Any

from tirl.core.bounds import shown
from tirl.core.config import ConfigError, _dataclass_of, _hints, _init_fields, _join, _variant


def _set_path(data: dict[str, Any], dotted: str, value: Any, *, after: str | None = None) -> None:
    """Set `dotted` in the nested mapping `data`, creating sections; a new top-level key goes where `after` (a key
    of `data`) is, so a migrated file keeps its order."""
    head, *rest = dotted.split(".")
    if rest:
        if not isinstance(data.get(head), dict):
            _insert(data, head, {}, after)
        _set_path(data[head], ".".join(rest), value)
    else:
        _insert(data, head, value, after)


def _insert(data: dict[str, Any], key: str, value: Any, after: str | None) -> None:
    if key in data or after not in data:
        data[key] = value
        return
    items = list(data.items())
    data.clear()
    for k, v in items:
        if k == after:
            data[key] = value
        data[k] = v


def _section_at(cls: type, data: Mapping[str, Any], dotted: str) -> type | None:
    """The dataclass (its variant, as `data` picks it) that holds the leaf of `dotted`, or None."""
    node: Any = data
    for part in dotted.split(".")[:-1]:
        cls = _variant(cls, node if isinstance(node, Mapping) else None)
        sub = _dataclass_of(_hints(cls).get(part)) if part in _init_fields(cls) else None
        if sub is None:
            return None
        cls, node = sub, node.get(part) if isinstance(node, Mapping) else None
    return _variant(cls, node if isinstance(node, Mapping) else None)


def _moves(
    cls: type, node: Mapping[str, Any], where: str, out: list[tuple[str, str, str, Any, bool]]
) -> None:
    """Collect (section, old key, new dotted key, value, was set) for every moved key in `node` and its sections,
    and for the keys it leaves out that `MOVED_DEFAULTS` gives a meaning."""
    cls = _variant(cls, node)
    moved, meant = getattr(cls, "MOVED_KEYS", {}), getattr(cls, "MOVED_DEFAULTS", {})
    for key, value in node.items():
        if key in moved and key not in _init_fields(cls):
            out.append((where, key, moved[key], value, True))
        elif key in _init_fields(cls) and isinstance(value, Mapping):
            if (sub := _dataclass_of(_hints(cls)[key])) is not None:
                _moves(sub, value, _join(where, key), out)
    out.extend((where, k, moved[k], v, False) for k, v in meant.items() if k not in node and k in moved)


def migrate_data(cls: type, data: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """A copy of a loaded config mapping in the current keys, and one line per change: every key a section's
    `MOVED_KEYS` names goes to its new dotted key (in the old key's place), a moved key the new section does not
    have (its variant takes no such setting: `rl.passk_k` under `rl.advantage.name: grpo`) is dropped, and a key
    the file left out whose meaning (`MOVED_DEFAULTS`) differs from the new place's default is written out, so the
    migrated file runs as the old one did. A key set both ways is an error."""
    out: dict[str, Any] = copy.deepcopy(dict(data))
    found: list[tuple[str, str, str, Any, bool]] = []
    _moves(cls, out, "", found)
    notes: list[str] = []
    for where, old, new, value, was_set in found:
        if not was_set:
            continue
        section = out
        for part in where.split(".") if where else ():
            section = section[part]
        if _lookup(out, new) is not _MISSING:
            raise ConfigError(
                f"config key '{_join(where, old)}' and its new name '{new}' are both set: keep one"
            )
        prefix = f"{where}." if where else ""
        if new.startswith(prefix):  # in the old key's place
            _set_path(section, new[len(prefix) :], value, after=old)
        else:
            _set_path(out, new, value)
        del section[old]
    for where, old, new, value, was_set in found:
        holder = _section_at(cls, out, new)
        leaf = new.rsplit(".", 1)[-1]
        fields_ = _init_fields(holder) if holder is not None else {}
        if was_set and leaf not in fields_:
            _drop(out, new)
            notes.append(f"dropped {_join(where, old)}={shown(value)}: {new} is not a setting there")
        elif was_set:
            notes.append(f"{_join(where, old)} -> {new}")
        elif leaf in fields_ and _lookup(out, new) is _MISSING and _default_of(fields_[leaf]) != value:
            _set_path(out, new, value)
            notes.append(f"{new}: {shown(value)} (what leaving out {_join(where, old)} meant)")
    return out, notes


_MISSING = object()


def _lookup(data: Mapping[str, Any], dotted: str) -> Any:
    node: Any = data
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return _MISSING
        node = node[part]
    return node


def _drop(data: dict[str, Any], dotted: str) -> None:
    *path, leaf = dotted.split(".")
    node = data
    for part in path:
        node = node[part]
    node.pop(leaf, None)


def _default_of(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else _MISSING


__all__ = ["migrate_data"]
