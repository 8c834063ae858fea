"""A chat template rendered with bounds on its work and on the size of what it builds.

A chat template comes with the model directory, and Jinja is a language: two nested `range(100000)` loops run
for hours, `"x" * 2000000000` asks for gigabytes, and the command rendering it would hang or run out of
memory. `render_template` renders as transformers' `apply_chat_template(tokenize=False)` does (its sandbox,
`ImmutableSandboxedEnvironment`, with the same globals and filters: `tojson`, `raise_exception`,
`strftime_now`, `namespace`, `dict`, the `generation` tag; messages without their None fields, reasoning under
the names templates read, the tokenizer's special tokens as variables), and charges each render:

- steps, at most MAX_STEPS: every loop iteration, call, filter, operator, lookup and output, each about the
  time it takes, plus work in proportion to its size (`tirl.chat.template_budget`);
- size: a string, list or integer built by `+`, `*`, `**`, `%`, `~`, a padding width, `replace`, `indent`,
  `join`, `format`, `sum`, `wordwrap` or `tojson` is refused before it is built when it would pass MAX_CHARS
  characters, MAX_ITEMS items or MAX_INT_BITS bits; a container about to be printed is measured first; the
  text a render writes (macros' and `set` blocks' included) is at most MAX_CHARS.

Loops and output are charged by rewriting the parsed template (`_Charge`): each `for` iterable and each
printed expression passes through a filter whose name (with a space) no template can write. A template past a
bound raises `TemplateBoundError` (a ValueError) saying which. The bounds sit far above what a chat template
spends (Qwen3's about 650 steps a message).
Deliberately not here: a clock (the cost is counted, so a slow or busy machine never refuses what a fast one
renders), processes or memory limits.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from functools import lru_cache, wraps
from typing import Any

from jinja2 import nodes
from jinja2.defaults import DEFAULT_FILTERS
from jinja2.exceptions import SecurityError, TemplateError
from jinja2.ext import Extension, loopcontrols
from jinja2.runtime import LoopContext, Macro
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace, pass_context
from jinja2.visitor import NodeTransformer

from tirl.chat.template_budget import (
    CHARS_PER_STEP,
    ITEM_STEPS,
    LOOKUP_STEPS,
    MACRO_STEPS,
    MAX_CHARS,
    TemplateBoundError,
    binop_size,
    built,
    charged,
    check_ints,
    cost,
    current_budget,
    filter_size,
    printed,
    refuse,
    string_method,
)

# transformers' names of a message's reasoning, the standard one first
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
_ITER, _OUT, _CONCAT = (
    "tirl iter",
    "tirl out",
    "tirl concat",
)  # filters only `_Charge` writes (a space in each)


class BoundedEnvironment(ImmutableSandboxedEnvironment):
    """transformers' chat-template sandbox, charging calls and operators to the render's budget (module
    docstring)."""

    intercepted_binops = frozenset({"+", "*", "**", "%"})

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        budget = current_budget()
        budget.charge(1 + cost(left) + cost(right))
        binop_size(operator, left, right, budget)
        return super().call_binop(context, operator, left, right)

    def call(self, context: Any, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
        budget = current_budget()
        method = getattr(obj, "__wrapped__", obj)  # the sandbox wraps str.format
        owner = getattr(method, "__self__", None)
        steps = (
            MACRO_STEPS if isinstance(obj, Macro | LoopContext) else 1
        )  # a frame rendered: many steps' time
        budget.charge(steps + cost(owner) + sum(map(cost, args)) + sum(map(cost, kwargs.values())))
        if isinstance(owner, str):
            args = string_method(getattr(method, "__name__", ""), owner, args, kwargs, budget)
        elif isinstance(obj, LoopContext) and args:  # a recursive loop's loop(children)
            args = (_count_iter(None, args[0]), *args[1:])
        return built(super().call(context, obj, *args, **kwargs))

    def getattr(self, obj: Any, attribute: str) -> Any:
        current_budget().charge(LOOKUP_STEPS)  # the sandbox's checks make a lookup cost several steps' time
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        current_budget().charge(LOOKUP_STEPS)
        return super().getitem(obj, argument)

    def _parse(self, source: str, name: str | None, filename: str | None) -> nodes.Template:
        return _Charge().visit(super()._parse(source, name, filename))


class _Charge(NodeTransformer):
    """Loops and output through the charging filters."""

    def visit_For(self, node: nodes.For) -> nodes.Node:
        node = self.generic_visit(node)
        node.iter = nodes.Filter(node.iter, _ITER, [], [], None, None, lineno=node.lineno)
        return node

    def visit_Output(self, node: nodes.Output) -> nodes.Node:
        node = self.generic_visit(node)
        node.nodes = [
            nodes.Filter(
                nodes.Const(n.data, lineno=n.lineno) if isinstance(n, nodes.TemplateData) else n,
                _OUT, [], [], None, None, lineno=n.lineno,
            )
            for n in node.nodes
        ]  # fmt: skip
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        node = self.generic_visit(node)
        return nodes.Filter(
            nodes.List(node.nodes, lineno=node.lineno), _CONCAT, [], [], None, None, lineno=node.lineno
        )


@pass_context
def _count_iter(context: Any, iterable: Any) -> Iterator[Any]:
    budget = current_budget()
    for item in iterable:
        budget.charge(1)
        yield item


@pass_context
def _count_out(context: Any, value: Any) -> str:
    budget = current_budget()
    if not isinstance(value, str):
        printed(value, budget)  # refused before str() builds it
        value = str(value)
    budget.charge(1 + len(value) // CHARS_PER_STEP)
    budget.write(len(value))
    return value


@pass_context
def _concat(context: Any, parts: list[Any]) -> str:
    budget, memo = current_budget(), {}
    size = sum(printed(p, budget, memo)[0] for p in parts)
    refuse("a string of", size, MAX_CHARS, "characters")
    budget.charge(1 + size // CHARS_PER_STEP)
    return "".join(str(p) for p in parts)  # jinja's own `~` outside autoescape


_STRINGIFY = frozenset(
    {"string", "pprint", "format", "replace", "indent", "center", "wordwrap", "truncate", "title", "upper",
     "lower", "capitalize", "trim", "striptags", "urlize", "urlencode", "escape", "e", "forceescape", "safe",
     "wordcount", "xmlattr"}
)  # fmt: skip  # filters that turn their value into text


def _bounded_filter(name: str, f: Callable[..., Any]) -> Callable[..., Any]:
    """Filter `f` charged to the budget, its result's size checked before (where it can be) and after it
    runs."""
    # 1: a context, eval context or environment comes before the value
    at = 1 if getattr(f, "jinja_pass_arg", None) is not None else 0

    @wraps(f)  # keeps jinja_pass_arg
    def bounded(*args: Any, **kwargs: Any) -> Any:
        budget = current_budget()
        value, rest = (args[at], args[at + 1 :]) if len(args) > at else (None, ())
        budget.charge(1 + cost(value) * (1 if isinstance(value, str) else ITEM_STEPS) + sum(map(cost, rest)))
        check_ints(rest, kwargs)
        if name in _STRINGIFY and not isinstance(value, str):
            printed(value, budget)
        value = filter_size(name, value, rest, kwargs, budget)
        result = built(f(*args[:at], value, *rest, **kwargs))
        budget.charge(cost(result))
        return result

    return bounded


def _tojson(
    x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False
) -> str:
    """transformers' `tojson` (no HTML escaping; its options), its size checked before it is built."""
    size, depth = printed(x, current_budget())
    pad = len(indent) if isinstance(indent, str) else (indent or 0)
    refuse("JSON of", size * (1 + depth * max(int(pad), 0)), MAX_CHARS, "characters")
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class _Generation(Extension):
    """transformers' `{% generation %}` tag (it marks the assistant's text for a mask tirl does not take from
    it): its body rendered as it is."""

    tags = {"generation"}

    def parse(self, parser: Any) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body, lineno=lineno)


class _TemplateNamespace(Namespace):
    """transformers' namespace: no attribute starting with an underscore (the way to CPython's internals)."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 - Namespace's own signature trick
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _TemplateNamespace._check_name(name)
        Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _TemplateNamespace._check_name(name)
        Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise SecurityError(f"a chat template cannot store the attribute {name!r} on a namespace")


def _raise_exception(message: Any) -> None:
    raise TemplateError(message)


class _TemplateDict:
    """transformers' `dict`: a call and `fromkeys`, no attribute of the type itself."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


@lru_cache(maxsize=1)
def _environment() -> BoundedEnvironment:
    env = BoundedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, loopcontrols])
    env.filters = {name: _bounded_filter(name, f) for name, f in DEFAULT_FILTERS.items()}
    env.filters["tojson"] = _bounded_filter("tojson", _tojson)
    env.filters.update({_ITER: _count_iter, _OUT: _count_out, _CONCAT: _concat})
    del env.globals["lipsum"]  # lorem ipsum of any length: no chat template writes it
    env.globals.update(
        raise_exception=_raise_exception, strftime_now=lambda fmt: datetime.now().strftime(fmt),
        dict=_TemplateDict(), namespace=_TemplateNamespace,
    )  # fmt: skip
    return env


@lru_cache(maxsize=16)
def _compiled(template: str) -> Any:
    with charged():  # filters of constants run while it compiles
        return _environment().from_string(template)


def _alias_reasoning(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each message without its None fields, its reasoning under every name templates read (as
    transformers)."""
    out = []
    for m in messages:
        m = {k: v for k, v in m.items() if v is not None}
        reasoning = next((m[k] for k in REASONING_FIELDS if m.get(k) is not None), None)
        out.append(m if reasoning is None else {"thinking": reasoning, **m, "reasoning_content": reasoning})
    return out


def render_template(
    template: str,
    messages: Sequence[dict[str, Any]],
    *,
    tools: Sequence[dict[str, Any]] | None = None,
    add_generation_prompt: bool = False,
    **variables: Any,
) -> str:
    """The text of `messages` in chat template `template` (as `apply_chat_template(tokenize=False)`;
    `variables`: the tokenizer's special tokens, `enable_thinking`, ...), within the module's bounds."""
    compiled = _compiled(template)
    with charged():
        return compiled.render(
            messages=_alias_reasoning(messages), tools=list(tools) if tools else None, documents=None,
            add_generation_prompt=add_generation_prompt, **variables,
        )  # fmt: skip


__all__ = ["BoundedEnvironment", "TemplateBoundError", "render_template"]
