"""A reader following the config from a stage's builder should not bounce between modules: each stage is built top
to bottom in one place (docs/architecture.md, "Stages and commands").

The walk: from a stage function, every call that passes `cfg` (or a section of it, `cfg.rl`) on, into the callee's
parameter that receives it, depth first in source order, each function once. A room is a module; entering one is a
call into it from a function of another module (several calls from one function into one module are one visit:
the reader has it open). No module may be entered more than twice.

Entries per module miss a reader sent back and forth: the trail (the stage's module, then each entry in the order
the walk makes it) may go A -> B -> A, or rollout.agent.loop -> rollout.timeouts -> rollout.agent.async_loop ->
rollout.agent.loop. A return is an entry into a module the trail already holds (a file the reader opened and left);
a stage's walk may make at most MAX_RETURNS of them (measured when the test was written: run_rl 4, run_eval 2,
run_sft 1).
"""

from __future__ import annotations

import ast
from collections import Counter
from functools import cache
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
MAX_ENTRIES = 2
MAX_RETURNS = 4


@cache
def module(name: str) -> tuple[dict[str, ast.AST], dict[str, tuple[str, str | None]]] | None:
    """(functions and methods by qualified name, imported names -> (module, attribute)) of a tirl module."""
    path = SRC / (name.replace(".", "/") + ".py")
    path = path if path.exists() else SRC / name.replace(".", "/") / "__init__.py"
    if not path.exists():
        return None
    tree = ast.parse(path.read_text())
    funcs: dict[str, ast.AST] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            funcs[node.name] = node
        if isinstance(node, ast.ClassDef):
            funcs |= {f"{node.name}.{f.name}": f for f in node.body if isinstance(f, ast.FunctionDef)}
    imports: dict[str, tuple[str, str | None]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tirl"):
            imports |= {a.asname or a.name: (node.module, a.name) for a in node.names}
    return funcs, imports


def resolve(mod: str, name: str) -> tuple[str, str] | None:
    """(module, qualified name) of the function `name` means in `mod` (a class: its __init__), through imports."""
    found = module(mod)
    if found is None:
        return None
    funcs, imports = found
    if name in funcs:
        init = f"{name}.__init__"
        return (
            (mod, init if init in funcs else None) if isinstance(funcs[name], ast.ClassDef) else (mod, name)
        )
    if name in imports and module(f"{imports[name][0]}.{imports[name][1]}") is None:
        return resolve(*imports[name])
    return None


def callee(mod: str, cls: str | None, func: ast.expr) -> tuple[str, str] | None:
    funcs, imports = module(mod)
    if isinstance(func, ast.Name):
        return resolve(mod, func.id)
    if not (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)):
        return None
    if func.value.id == "self" and cls and f"{cls}.{func.attr}" in funcs:
        return mod, f"{cls}.{func.attr}"
    if func.value.id in imports:  # `from tirl.train import checkpoint` then `checkpoint.f(...)`
        return resolve(".".join(filter(None, imports[func.value.id])), func.attr)
    return None


def carries(expr: ast.expr, tracked: set[str]) -> bool:
    while isinstance(expr, ast.Attribute):
        expr = expr.value
    return isinstance(expr, ast.Name) and expr.id in tracked


def walk(mod: str, qual: str, tracked: set[str], seen: set, entries: list[str]) -> None:
    seen.add((mod, qual))
    node, cls, opened = module(mod)[0][qual], qual.split(".")[0] if "." in qual else None, set()
    for call in sorted(
        (n for n in ast.walk(node) if isinstance(n, ast.Call)), key=lambda n: (n.lineno, n.col_offset)
    ):
        target = callee(mod, cls, call.func)
        if target is None or target[1] is None:
            continue
        fn = module(target[0])[0][target[1]]
        params = [a.arg for a in fn.args.posonlyargs + fn.args.args if a.arg != "self"]
        named = set(params) | {a.arg for a in fn.args.kwonlyargs}
        passed = {params[i] for i, a in enumerate(call.args) if i < len(params) and carries(a, tracked)}
        passed |= {k.arg for k in call.keywords if k.arg in named and carries(k.value, tracked)}
        if not passed:
            continue
        if target[0] != mod and target[0] not in opened:
            opened.add(target[0])
            entries.append(target[0])
        if target not in seen:
            walk(*target, passed, seen, entries)


@pytest.mark.parametrize("stage", ["run_rl", "run_sft", "run_eval"])
def test_following_cfg_from_a_stage_enters_no_module_more_than_twice(stage):
    entries: list[str] = []
    walk("tirl.commands.stages", stage, {"cfg"}, set(), entries)
    assert len(entries) >= 5, entries  # the walk follows the builder into the packages it wires
    counts = Counter(entries)
    over = {m: n for m, n in counts.items() if n > MAX_ENTRIES}
    assert not over, f"following cfg from {stage} enters these modules more than {MAX_ENTRIES} times: {over}"


def returns(trail: list[str]) -> list[str]:
    """Each step of `trail` into a module it already holds, as `A -> ... -> A` (the trail from that module's
    last place to its return)."""
    found = []
    for i, m in enumerate(trail):
        if m in trail[:i]:
            last = max(j for j in range(i) if trail[j] == m)
            found.append(" -> ".join(x.removeprefix("tirl.") for x in trail[last : i + 1]))
    return found


def test_returns_are_entries_into_a_module_the_trail_already_left():
    trail = ["s", "a", "b", "a", "c", "s", "b"]
    assert returns(trail) == ["a -> b -> a", "s -> a -> b -> a -> c -> s", "b -> a -> c -> s -> b"]
    assert returns(["s", "a", "b"]) == []


@pytest.mark.parametrize("stage", ["run_rl", "run_sft", "run_eval"])
def test_following_cfg_from_a_stage_returns_to_a_module_it_left_at_most_max_returns_times(stage):
    entries: list[str] = []
    walk("tirl.commands.stages", stage, {"cfg"}, set(), entries)
    back = returns(["tirl.commands.stages", *entries])
    assert len(back) <= MAX_RETURNS, (
        f"following cfg from {stage} goes back to a module it left {len(back)} times (at most {MAX_RETURNS}):\n"
        + "\n".join(back)
    )
