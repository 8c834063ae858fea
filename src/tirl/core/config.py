"""Config machinery: nested dataclasses <-> YAML, with dotted `key=value` overrides and errors naming the key.

A run's config is a tree of plain dataclasses; this module only moves values between YAML, command-line
overrides and those dataclasses, checking every key and type on the way, so a typo (`rl.lrr=1e-3`) fails at
start-up instead of being silently ignored. Semantic checks (a learning rate must be positive) live in each
dataclass's `__post_init__`; errors raised there come back as `ConfigError` prefixed with the section's path.

Three hooks a config dataclass may define, each for one job:
- `MOVED_KEYS` (ClassVar dict): a key that used to live here -> its new dotted key; using it is an error naming
  the new one (the old flat `rollout.vllm_args` says `rollout.vllm.args`), and `tirl.core.migrate` (`tirl config
  migrate`) moves it there; `MOVED_DEFAULTS` (ClassVar dict, optional): what such a key meant when a file left it
  out, written by the migration where the new place's default differs (`tirl.core.migrate`);
- `VARIANT_KEY` and `config_variant(value)` (classmethod): the section's dataclass depends on one of its own keys
  (`task.name` picks the task's options dataclass, a subclass);
- `resolve_data(data)` (classmethod, on the root): rewrite the loaded mapping before it is built, knowing which
  keys the user set (`fidelity: recipe` fills in only the keys the user left out).

Sections a registry contributes are declared with `with_sections(sections)` under `@dataclass`: each becomes an
ordinary field (each engine's `rollout.<name>.*`, `tirl.rollout.config`), so nothing here treats them apart.

YAML is read by `tirl.core.yamlread`, tirl's one YAML reader: aliases are allowed, but a document whose aliases
expand it past `MAX_EXPANDED_VALUES` values, an alias inside the value it names, or a key given twice in one
mapping is refused as it loads. Values shown in error messages are shortened (`tirl.core.bounds.shown`): a huge value would
flood the message. The bounds values must lie in, and their checks, are `tirl.core.bounds`.

Deliberately not here: interpolation, includes, `_component_`-style object construction or generated YAML.
A reader finds what runs by reading the dataclasses.
"""

from __future__ import annotations

import copy
import dataclasses
import re
import types
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

import yaml

from tirl.core.bounds import shown
from tirl.core.errors import ConfigError
from tirl.core.io import atomic_write_text
from tirl.core.yamlread import load_yaml, read_yaml_file

T = TypeVar("T")

# PyYAML follows YAML 1.1, where `1e-3` (no dot) is a string; these strings are accepted for float fields.
_FLOAT_RE = re.compile(r"^[-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?$")


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _type_name(tp: Any) -> str:
    if isinstance(tp, type):
        return tp.__name__
    return str(tp).replace("typing.", "")


def _init_fields(cls: type) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls) if f.init}


def _hints(cls: type) -> dict[str, Any]:
    try:
        return get_type_hints(cls)
    except Exception as e:  # a forward reference that cannot be resolved is a bug in the config class
        raise TypeError(f"cannot resolve the type hints of {cls.__name__}: {e}") from e


def _valid_keys(cls: type) -> str:
    return ", ".join(_init_fields(cls))


def _unknown(cls: type, where: str, key: str, context: str = "") -> ConfigError:
    """The error for a key `cls` does not have: where it moved to, or the valid keys."""
    dotted = _join(where, key)
    moved = getattr(cls, "MOVED_KEYS", {}).get(key)
    if moved:
        return ConfigError(
            f"config key '{dotted}'{context} is now '{moved}' (`tirl config migrate FILE` rewrites a config file)"
        )
    level = f"'{where}'" if where else "the top level"
    if getattr(cls, "VARIANT_KEY", None):  # the keys depend on the variant: name the one in use
        level += f" ({cls.__name__})"
    return ConfigError(f"unknown config key '{dotted}'{context}; valid keys at {level}: {_valid_keys(cls)}")


def _variant(cls: type, data: Mapping[str, Any] | None, pending: Any = None) -> type:
    """The dataclass to build for section `cls`: itself, or the one its `VARIANT_KEY`'s value names."""
    key = getattr(cls, "VARIANT_KEY", None)
    if key is None:
        return cls
    value = pending if pending is not None else (data or {}).get(key)
    if value is None:
        value = _init_fields(cls)[key].default
    return cls.config_variant(value)


def _is_union(tp: Any) -> bool:
    return get_origin(tp) in (Union, types.UnionType)


def _bad_type(key: str, tp: Any, value: Any) -> ConfigError:
    return ConfigError(
        f"config key '{key}' expects {_type_name(tp)}, got {shown(value)} ({type(value).__name__})"
    )


def _convert(tp: Any, value: Any, key: str) -> Any:
    """Check `value` against the annotation `tp`; return it in the annotated form (lists to tuples etc.)."""
    origin = get_origin(tp)
    if tp is Any:
        return value
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        if isinstance(value, tp):
            return value
        if not isinstance(value, Mapping):
            raise _bad_type(key, tp, value)
        return from_dict(tp, value, where=key)
    if _is_union(tp):
        return _convert_union(tp, value, key)
    if origin is Literal:
        return _convert_literal(tp, value, key)
    if origin in (list, tuple) or tp in (list, tuple):
        return _convert_sequence(tp, value, key)
    if origin is dict or tp is dict:
        if not isinstance(value, Mapping):
            raise _bad_type(key, tp, value)
        kt, vt = get_args(tp) or (Any, Any)
        return {_convert(kt, k, key): _convert(vt, v, f"{key}.{k}") for k, v in value.items()}
    if tp in (bool, int, float, str):
        return _convert_scalar(tp, value, key)
    if isinstance(tp, type):
        if isinstance(value, tp):
            return value
        raise _bad_type(key, tp, value)
    raise TypeError(f"config key '{key}' has an unsupported annotation {_type_name(tp)}")


def _convert_union(tp: Any, value: Any, key: str) -> Any:
    args = get_args(tp)
    if value is None:
        if type(None) in args:
            return None
        raise _bad_type(key, tp, value)
    options = [a for a in args if a is not type(None)]
    if len(options) == 1:  # Optional[X]: let X's own, more specific error through
        return _convert(options[0], value, key)
    for arg in options:
        try:
            return _convert(arg, value, key)
        except ConfigError:
            continue
    raise _bad_type(key, tp, value)


def _convert_literal(tp: Any, value: Any, key: str) -> Any:
    choices = get_args(tp)
    if any(value == c and type(value) is type(c) for c in choices):
        return value
    if isinstance(value, bool) and ("on" if value else "off") in choices:
        return "on" if value else "off"  # YAML 1.1 reads a bare off/on (and no/yes) as a boolean
    raise ConfigError(f"config key '{key}' must be one of {list(choices)}, got {shown(value)}")


def _convert_scalar(tp: type, value: Any, key: str) -> Any:
    """bool, int, float, str: no silent coercion (a bool is not an int; "1e-5" is a float, as YAML 1.1 misses)."""
    if tp is bool and isinstance(value, bool):
        return value
    if tp is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str) and _FLOAT_RE.match(value.strip()):
            return float(value)
    if tp is str and isinstance(value, str):
        return value
    raise _bad_type(key, tp, value)


def _convert_sequence(tp: Any, value: Any, key: str) -> list | tuple:
    if not isinstance(value, list | tuple):
        raise _bad_type(key, tp, value)
    origin = get_origin(tp) or tp
    args = get_args(tp)
    if origin is list:
        item_tp = args[0] if args else Any
        return [_convert(item_tp, v, f"{key}[{i}]") for i, v in enumerate(value)]
    if not args:
        return tuple(value)
    if len(args) == 2 and args[1] is Ellipsis:
        return tuple(_convert(args[0], v, f"{key}[{i}]") for i, v in enumerate(value))
    if len(args) != len(value):
        raise ConfigError(
            f"config key '{key}' expects {len(args)} items ({_type_name(tp)}), got {shown(value)}"
        )
    return tuple(_convert(a, v, f"{key}[{i}]") for i, (a, v) in enumerate(zip(args, value, strict=True)))


def with_sections(sections: Mapping[str, type]) -> Callable[[type[T]], type[T]]:
    """Class decorator, placed under `@dataclass`: a field `name: section = field(default_factory=section)` for each
    entry, after the fields the class declares, for sections that a registry contributes rather than the class
    names. A name the class already has is a TypeError."""

    def add(cls: type[T]) -> type[T]:
        annotations = cls.__dict__.get("__annotations__")
        if annotations is None:
            annotations = cls.__annotations__ = {}
        for name, section in sections.items():
            if name in annotations or hasattr(cls, name):
                raise TypeError(f"{cls.__name__} already has {name!r}: a section cannot take its name")
            annotations[name] = section
            setattr(cls, name, dataclasses.field(default_factory=section))
        return cls

    return add


def from_dict(cls: type[T], data: Mapping[str, Any], *, where: str = "") -> T:
    """Build the dataclass `cls` from `data`, recursing into nested dataclasses; missing keys get defaults."""
    if not (dataclasses.is_dataclass(cls) and isinstance(cls, type)):
        raise TypeError(f"from_dict needs a dataclass type, got {cls!r}")
    if not isinstance(data, Mapping):
        raise ConfigError(f"config section '{where or '<root>'}' must be a mapping, got {shown(data)}")
    try:
        cls = _variant(cls, data)
    except ValueError as e:
        raise ConfigError(f"{where or cls.__name__}: {e}") from e
    known = _init_fields(cls)
    for key in data:
        if key not in known:
            raise _unknown(cls, where, str(key))
    hints = _hints(cls)
    kwargs = {name: _convert(hints[name], value, _join(where, name)) for name, value in data.items()}
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except ValueError as e:
        raise ConfigError(f"{where or cls.__name__}: {e}") from e


def _dataclass_of(tp: Any) -> type | None:
    """The dataclass a field holds (also through Optional), or None for a leaf field."""
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return tp
    if _is_union(tp):
        inner = [a for a in get_args(tp) if a is not type(None)]
        if len(inner) == 1:
            return _dataclass_of(inner[0])
    return None


def _accepts(tp: Any, kind: type) -> bool:
    if tp is kind:
        return True
    return _is_union(tp) and kind in get_args(tp)


def _parse_override(raw: str, tp: Any, item: str) -> Any:
    try:
        value = load_yaml(raw) if raw.strip() else ""
    except ConfigError as e:
        raise ConfigError(f"override {item!r}: {e}") from None
    except yaml.YAMLError as e:  # one line naming the override, not PyYAML's multi-line report
        mark = getattr(e, "problem_mark", None)
        at = f" at column {mark.column + 1} of the value" if mark is not None else ""
        problem = getattr(e, "problem", None) or type(e).__name__
        shown = raw if '"' not in raw else "..."
        raise ConfigError(
            f"override {item!r}: the value is not valid YAML ({problem}{at}); to pass it as text, quote it: "
            f"{item.split('=', 1)[0]}='\"{shown}\"'"
        ) from None
    if isinstance(value, str) and _accepts(tp, float) and _FLOAT_RE.match(value.strip()):
        return float(value)
    if _accepts(tp, str) and value is not None and isinstance(value, int | float | bool):
        return raw.strip()  # `run.name=2024` means the string, not the number
    return value


def _pending(overrides: Sequence[str], prefix: str, section: type) -> Any:
    """The value the last override gives the variant key of the section at `prefix`, parsed, or None."""
    key = getattr(section, "VARIANT_KEY", None)
    if key is None:
        return None
    target, value = _join(prefix, key), None
    for item in overrides:
        dotted, _, raw = item.partition("=")
        if dotted.strip() == target:
            try:
                value = load_yaml(raw) if raw.strip() else ""
            except (yaml.YAMLError, ConfigError):  # the override's own parse names it
                value = raw.strip()
    return value


def apply_overrides(data: Mapping[str, Any], overrides: Sequence[str], cls: type) -> dict[str, Any]:
    """A copy of `data` with each `dotted.key=value` set; keys are checked against the fields of `cls`. An override
    that names another variant of a section (`rl.loss.name=gspo` over a ppo section) drops the section's other keys,
    wherever it stands in the list: the new variant starts from its own defaults (GSPO from the GSPO paper's clip
    ranges), and the other overrides set its options."""
    out: dict[str, Any] = copy.deepcopy(dict(data))
    for variants in (True, False):  # variant switches first, so that no option set beside one is dropped
        for item in overrides:
            _apply_override(out, item, overrides, cls, variants)
    return out


def _apply_override(
    out: dict[str, Any], item: str, overrides: Sequence[str], cls: type, variants: bool
) -> None:
    """Set one `dotted.key=value` in `out` (`variants`: only if it names a section's variant, else only if not)."""
    if "=" not in item:
        raise ConfigError(f"override {item!r} must have the form dotted.key=value")
    dotted, raw = item.split("=", 1)
    parts = dotted.strip().split(".")
    if not all(parts):
        raise ConfigError(f"override {item!r} has an empty key")
    node, section = out, cls
    for i, part in enumerate(parts):
        prefix = ".".join(parts[:i])
        try:
            section = _variant(section, node, _pending(overrides, prefix, section))
        except ValueError as e:
            raise ConfigError(f"override {item!r}: {e}") from e
        if part not in _init_fields(section):
            raise _unknown(section, prefix, part, f" in override {item!r}")
        tp = _hints(section)[part]
        if i == len(parts) - 1:
            is_variant = part == getattr(section, "VARIANT_KEY", None)
            if is_variant != variants:
                return
            value = _parse_override(raw, tp, item)
            # another variant (than the section's own, or its default when the file names none): it starts from
            # its own defaults, not the old one's options
            if is_variant and node.get(part, _init_fields(section)[part].default) != value:
                node.clear()
            node[part] = value
            return
        sub = _dataclass_of(tp)
        if sub is None:
            raise ConfigError(f"config key '{_join(prefix, part)}' ({_type_name(tp)}) is not a section")
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node, section = node[part], sub


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The mapping a YAML config file holds (read by `tirl.core.yamlread`), with errors naming the file."""
    path = Path(path)
    data = read_yaml_file(path, "config file")
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"config file {path} must hold a mapping at the top level, got {type(data).__name__}"
        )
    return dict(data)


def load_config(cls: type[T], path: str | Path | None = None, overrides: Sequence[str] = ()) -> T:
    """YAML file (optional) -> dotted overrides -> validated dataclass `cls`."""
    data: Any = {} if path is None else read_config_file(path)
    data = apply_overrides(data, overrides, cls)
    if hasattr(cls, "resolve_data"):
        data = cls.resolve_data(data)
    return from_dict(cls, data)


def to_dict(cfg: Any) -> Any:
    """Plain YAML-safe types: dataclasses become dicts, tuples become lists."""
    if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
        return {f.name: to_dict(getattr(cfg, f.name)) for f in dataclasses.fields(cfg) if f.init}
    if isinstance(cfg, list | tuple):
        return [to_dict(v) for v in cfg]
    if isinstance(cfg, Mapping):
        return {k: to_dict(v) for k, v in cfg.items()}
    return cfg


def save_config(cfg: Any, path: str | Path) -> Path:
    """Write `cfg` as YAML (field order kept) so that `load_config(type(cfg), path) == cfg`."""
    text = yaml.safe_dump(to_dict(cfg), sort_keys=False, allow_unicode=True)
    return atomic_write_text(path, text)


__all__ = [
    "ConfigError",
    "apply_overrides",
    "from_dict",
    "load_config",
    "read_config_file",
    "save_config",
    "to_dict",
    "with_sections",
]
