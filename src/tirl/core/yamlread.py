"""The one YAML reader of tirl: every YAML document tirl reads (a config, an override's value, `tirl compare --arms`,
a run's saved config.yaml) goes through `load_yaml` or `read_yaml_file`, never `yaml.safe_load`.

It is PyYAML's safe loader with three refusals, each raised as a one-line `ConfigError` while the document loads:
- aliases that expand the document past `MAX_EXPANDED_VALUES` values: a few hundred bytes of nested aliases (the
  "billion laughs") otherwise expand to gigabytes in the first error message that prints the value;
- an alias inside the value it names (`a: &a [1, *a]`), which would expand without end (a RecursionError later);
- a key given twice in one mapping, at any depth (YAML requires keys to be unique; PyYAML keeps the last one without
  a word, so `lr: 1e-3` then `lr: 1e-5` further down would silently train at the second). Keys that a merge key
  (`<<: *base`) brings in may be overridden, as YAML intends.

Deliberately not here: what the values mean (`tirl.core.config` checks them against the dataclasses), and writing
YAML (`yaml.safe_dump`, which has nothing to refuse).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tirl.core.errors import ConfigError

# the values a document may expand to through its aliases; tirl's largest config holds a few hundred
MAX_EXPANDED_VALUES = 100_000
_MERGE_TAG = "tag:yaml.org,2002:merge"


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing alias expansions past `MAX_EXPANDED_VALUES` values, a value that contains its
    own alias, and a key given twice in one mapping."""

    def compose_document(self) -> Any:
        named: dict[int, str] = {}  # node -> its anchor, for each node an alias names
        self.anchors = _AnchorsSeen(self.anchors, named)
        node = super().compose_document()  # which forgets its anchors: `named` keeps what the check needs
        if named:
            _check_expansion(node, named)
        return node

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:  # before the merge keys are flattened in: only the keys written here
            if key_node.tag == _MERGE_TAG:
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                line = seen.setdefault(key, key_node.start_mark.line + 1)
            except TypeError:  # an unhashable key: PyYAML's own error says so
                continue
            if line != key_node.start_mark.line + 1:
                raise ConfigError(
                    f"the key {_short(key)} is given twice in one mapping (lines {line} and "
                    f"{key_node.start_mark.line + 1}): keep one"
                )
        return super().construct_mapping(node, deep=deep)


def _short(key: Any) -> str:
    text = repr(key)
    return text if len(text) <= 80 else text[:77] + "..."


class _AnchorsSeen(dict):
    """The loader's anchors, recording the nodes an alias names (only those can be expanded more than once)."""

    def __init__(self, anchors: dict, named: dict[int, str]) -> None:
        super().__init__(anchors)
        self.named = named

    def __getitem__(self, anchor: str) -> yaml.Node:
        node = super().__getitem__(anchor)
        self.named[id(node)] = anchor
        return node


def _check_expansion(root: yaml.Node, named: dict[int, str]) -> None:
    """Raise unless `root` expands to at most `MAX_EXPANDED_VALUES` values and no value holds an alias to itself;
    each node is sized once (memoised), so the check costs what composing the document did."""
    sizes: dict[int, int] = {}
    inside: set[int] = set()  # the nodes being sized: reaching one again is a cycle

    def size(node: yaml.Node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in inside:
            anchor = named.get(key, "?")
            raise ConfigError(
                f"the value &{anchor} at line {node.start_mark.line + 1} contains its own alias *{anchor} (it "
                "would expand without end): write the value out"
            )
        inside.add(key)
        if isinstance(node, yaml.MappingNode):
            n = 1 + sum(size(k) + size(v) for k, v in node.value)
        elif isinstance(node, yaml.SequenceNode):
            n = 1 + sum(size(v) for v in node.value)
        else:
            n = 1
        inside.discard(key)
        sizes[key] = n
        return n

    if size(root) > MAX_EXPANDED_VALUES:
        raise ConfigError(
            f"its aliases expand to more than {MAX_EXPANDED_VALUES} values (a YAML 'billion laughs'?): write the "
            "values out, or alias fewer"
        )


def load_yaml(text: str) -> Any:
    """The value of a YAML document, loaded safely; raises `ConfigError` for what this module refuses and
    `yaml.YAMLError` for text that is not YAML."""
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass
    except RecursionError:  # PyYAML composes and constructs recursively
        raise ConfigError("it is nested too deeply to read (a few hundred levels at most)") from None


def yaml_problem(e: yaml.YAMLError) -> str:
    """PyYAML's multi-line report in one line: the problem and where it is."""
    mark = getattr(e, "problem_mark", None)
    at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    problem = getattr(e, "problem", None) or next(iter(str(e).splitlines()), "") or type(e).__name__
    return f"{problem}{at}"


def read_yaml_file(path: str | Path, what: str = "config file") -> Any:
    """The value the YAML file `path` holds; every error is one line naming `what` and the file."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{what} not found: {path}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"{what} {path} is not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {e.start}): "
            "save it as UTF-8"
        ) from None
    except OSError as e:
        raise ConfigError(f"{what} {path} cannot be read: {e.strerror or e}") from None
    try:
        return load_yaml(text)
    except ConfigError as e:
        raise ConfigError(f"{what} {path}: {e}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{what} {path} is not valid YAML: {yaml_problem(e)}") from None


__all__ = ["MAX_EXPANDED_VALUES", "load_yaml", "read_yaml_file", "yaml_problem"]
