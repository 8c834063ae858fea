"""A tool's JSON schema from its Python signature and Google-style docstring, and the check of a call against it.

The layout is the one Hugging Face's `get_json_schema` writes and Qwen's template lists in its "# Tools" block:
`{"type": "function", "function": {"name", "description", "parameters": {"type": "object", "properties": {...},
"required": [...]}}}`, each property `{"type", ["items"], ["enum"], ["nullable"], "description"}`. The return
value is left out (the model never writes it). Supported hints: str, int, float, bool, list[X], dict / dict[str, X],
Literal[...] of scalars, and `X | None`; anything else is a TypeError naming the parameter.

`check_arguments` is what the agent runs before a call: unknown or missing argument names and wrong JSON types
become one error text for the model, never an exception.
"""

from __future__ import annotations

import inspect
import re
import types
from collections.abc import Callable
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

_SCALARS: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}
_SECTION_RE = re.compile(
    r"^\s*(Args|Arguments|Parameters|Returns|Return|Raises|Yields|Examples?|Notes?):\s*$"
)
_ARG_RE = re.compile(r"^\s*(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")


def _type_schema(hint: Any, where: str) -> dict[str, Any]:
    origin, args = get_origin(hint), get_args(hint)
    if hint in _SCALARS:
        return {"type": _SCALARS[hint]}
    if hint is list or origin is list:
        return {"type": "array", "items": _type_schema(args[0], where)} if args else {"type": "array"}
    if hint is dict or origin is dict:
        out: dict[str, Any] = {"type": "object"}
        if len(args) == 2:
            out["additionalProperties"] = _type_schema(args[1], where)
        return out
    if origin is Literal:
        kinds = list(dict.fromkeys(_SCALARS.get(type(a)) for a in args))
        if None in kinds:
            raise TypeError(f"{where}: Literal values must be str, int, float or bool, got {args}")
        return {"type": kinds[0] if len(kinds) == 1 else kinds, "enum": list(args)}
    if origin is Union or origin is types.UnionType:
        rest = [a for a in args if a is not type(None)]
        if len(rest) != 1:
            raise TypeError(f"{where}: only `X | None` unions are supported, got {hint}")
        return {**_type_schema(rest[0], where), "nullable": True}
    raise TypeError(f"{where}: cannot describe type {hint!r} in a tool schema (use str, int, float, bool, list, "
                    "dict, Literal or X | None)")  # fmt: skip


def parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """(description, {argument: description}) of a Google-style docstring."""
    lines = inspect.cleandoc(doc).splitlines()
    desc: list[str] = []
    args: dict[str, str] = {}
    section, current, args_indent = None, None, 0
    for line in lines:
        m = _SECTION_RE.match(line)
        if m:
            section, current = m.group(1), None
            continue
        if section is None:
            desc.append(line)
        elif section in ("Args", "Arguments", "Parameters") and line.strip():
            a = _ARG_RE.match(line)
            indent = len(line) - len(line.lstrip())
            if a and (current is None or indent <= args_indent):
                current, args_indent = a.group(1), indent
                args[current] = a.group(2).strip()
            elif current is not None:
                args[current] = (args[current] + " " + line.strip()).strip()
    return "\n".join(desc).strip(), args


def function_schema(fn: Callable[..., Any], *, name: str | None = None) -> dict[str, Any]:
    """The OpenAI/Qwen function schema of `fn`: every parameter needs a type hint; descriptions come from the
    docstring (required: a tool the model cannot read about is a tool it cannot use)."""
    tool_name = name or getattr(fn, "__name__", "")
    if not tool_name.isidentifier():
        raise ValueError(f"a tool needs a name that is an identifier, got {tool_name!r}")
    doc = inspect.getdoc(fn)
    if not doc:
        raise ValueError(f"tool {tool_name!r} has no docstring: the model reads it as the tool's description")
    description, arg_docs = parse_docstring(doc)
    hints = get_type_hints(fn)
    properties: dict[str, Any] = {}
    required: list[str] = []
    for pname, param in inspect.signature(fn).parameters.items():
        where = f"tool {tool_name!r}, argument {pname!r}"
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise TypeError(f"{where}: *args / **kwargs cannot be described to the model")
        if pname not in hints:
            raise TypeError(f"{where}: missing a type hint")
        prop = _type_schema(hints[pname], where)
        if pname in arg_docs:
            prop["description"] = arg_docs[pname]
        properties[pname] = prop
        if param.default is param.empty:
            required.append(pname)
    parameters: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        parameters["required"] = required
    return {
        "type": "function",
        "function": {"name": tool_name, "description": description, "parameters": parameters},
    }


_JSON_NAMES = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array", dict: "object"}


def _json_type(value: Any) -> str:
    return "null" if value is None else _JSON_NAMES.get(type(value), type(value).__name__)


def _check_value(value: Any, prop: dict[str, Any], where: str) -> str | None:
    if value is None:
        return None if prop.get("nullable") else f"{where} must not be null"
    if "enum" in prop and value not in prop["enum"]:
        return f"{where} must be one of {prop['enum']}, got {value!r}"
    kinds = prop.get("type")
    kinds = [kinds] if isinstance(kinds, str) else list(kinds or [])
    got = _json_type(value)
    ok = not kinds or got in kinds or (got == "integer" and "number" in kinds)
    if not ok:
        return f"{where} must be {' or '.join(kinds)}, got {got} {value!r}"
    if got == "array" and "items" in prop:
        for i, v in enumerate(value):
            if err := _check_value(v, prop["items"], f"{where}[{i}]"):
                return err
    if got == "object" and "additionalProperties" in prop:
        for k, v in value.items():
            if err := _check_value(v, prop["additionalProperties"], f"{where}[{k!r}]"):
                return err
    return None


def check_arguments(schema: dict[str, Any], arguments: dict[str, Any]) -> str | None:
    """None if `arguments` fit the function schema, else one sentence naming every problem found."""
    fn = schema.get("function", schema)
    params = fn.get("parameters", {})
    props: dict[str, Any] = params.get("properties", {})
    problems = []
    unknown = [k for k in arguments if k not in props]
    if unknown:
        problems.append(
            f"unknown argument {', '.join(map(repr, unknown))} (valid: {', '.join(props) or 'none'})"
        )
    missing = [k for k in params.get("required", []) if k not in arguments]
    if missing:
        problems.append(f"missing required argument {', '.join(map(repr, missing))}")
    for k, v in arguments.items():
        if k in props and (err := _check_value(v, props[k], f"argument {k!r}")):
            problems.append(err)
    return f"Error: bad arguments for tool {fn.get('name')!r}: {'; '.join(problems)}." if problems else None


__all__ = ["check_arguments", "function_schema", "parse_docstring"]
