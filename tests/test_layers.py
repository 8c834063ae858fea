"""The import layers of `src/tirl`: no module imports a module of a higher layer, not even lazily, nor one that
stands beside it in its own layer (train and eval, rollout and tasks: neither of a pair knows the other).

A lower layer that reaches up (directly, through a package `__init__`, or through an import inside a function)
turns the layers into a tangle: the next engine, trainer or command then touches code it should not know about.
Imports are read with `ast`, so lazy imports count; imports under `if TYPE_CHECKING:` are annotations only and do
not. `LAYERS` is also the diagram of docs/architecture.md (a test keeps the two the same). The algorithm math has
a stricter rule on top (docs/STYLE.md): it imports only torch and the standard library.
"""

from __future__ import annotations

import ast
import sys
from collections import deque
from pathlib import Path

import tirl

SRC = Path(tirl.__file__).parent
ARCHITECTURE = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"

# Bottom to top. A module may import its own entry and the layers below it. Entries are packages or modules;
# the longest matching entry places a module, so the `tirl <command>` front ends of data/, models/ and sandbox/
# sit with the commands rather than with their package. The entries of one layer stand side by side and do not
# import one another (rewards scores text against a problem row and knows no trajectory; the episode driver,
# rollout/episodes.py, scores through it; the RL trainer and the evaluator share only what lies below them, and
# in-training validation is wired by the RL stage above both), except in the layers of MIXED_LAYERS.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("package root", ("tirl",)),
    ("foundation", ("tirl.core", "tirl.algorithms")),
    ("chat, sandbox, data", ("tirl.chat", "tirl.sandbox", "tirl.data")),
    ("tools, models, rewards", ("tirl.tools", "tirl.models", "tirl.rewards")),
    ("rollout, tasks", ("tirl.rollout", "tirl.tasks")),
    ("eval, train", ("tirl.eval", "tirl.train")),
    ("run config", ("tirl.commands.run_config",)),
    (
        "stages and commands",
        (
            "tirl.commands",
            "tirl.data.commands",
            "tirl.data.filter",
            "tirl.data.sample",
            "tirl.models.commands",
            "tirl.sandbox.cli",
        ),
    ),
    ("demo", ("tirl.demo",)),
    ("cli", ("tirl.cli", "tirl.__main__")),
)

# Layers whose entries may import one another: the command front ends call into each other, `__main__` runs the cli.
MIXED_LAYERS = {"stages and commands", "cli"}

# Known upward imports, each named with the change that removes it: (importing module, imported module).
# Upward imports allowed by name (none: gather-for-export lives in train/fsdp.py, so models/ never imports train/).
ALLOWED_UPWARD: set[tuple[str, str]] = set()

# Third-party imports allowed per layer entry (an entry not listed may import any installed package).
EXTERNAL_ALLOWED = {"tirl.algorithms": {"torch", "__future__"} | set(sys.stdlib_module_names)}


def module_name(path: Path, src: Path) -> str:
    parts = list(path.relative_to(src.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_type_checking_block(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")
    )


def import_nodes(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement, at any depth (inside functions too), except under `if TYPE_CHECKING:`."""
    found, stack = [], [tree]
    while stack:
        node = stack.pop()
        if is_type_checking_block(node):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        stack.extend(ast.iter_child_nodes(node))
    return found


def imported_names(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list[str]:
    """Absolute names an import statement loads (`from a import b` may load module a.b: both are listed)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    return [target] + [f"{target}.{alias.name}" for alias in node.names]


def import_graph(src: Path) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(module -> tirl modules its execution imports, module -> top-level names of its external imports).

    Importing `a.b.c` runs `a/__init__.py` and `a/b/__init__.py` too, so those are edges as well."""
    paths = {module_name(p, src): p for p in sorted(src.rglob("*.py"))}
    root = src.name
    graph: dict[str, set[str]] = {}
    external: dict[str, set[str]] = {}
    for module, path in paths.items():
        graph[module], external[module] = set(), set()
        for node in import_nodes(ast.parse(path.read_text(), filename=str(path))):
            names = imported_names(node, module, path.name == "__init__.py")
            if any((module, name) in ALLOWED_UPWARD for name in names):
                continue  # the whole statement: `from a import b` also runs a/__init__.py
            for name in names:
                if name.split(".")[0] != root:
                    external[module].add(name.split(".")[0])
                    continue
                parts = name.split(".")
                graph[module] |= {".".join(parts[:i]) for i in range(1, len(parts) + 1)} & paths.keys()
        graph[module].discard(module)
    return graph, external


def layer_entry(module: str) -> str:
    entries = [e for _, names in LAYERS for e in names if module == e or module.startswith(e + ".")]
    if not entries:
        raise AssertionError(f"{module} is in no layer: add it (or its package) to LAYERS in {__file__}")
    return max(entries, key=len)


def layer_of(module: str) -> int:
    entry = layer_entry(module)
    return next(i for i, (_, names) in enumerate(LAYERS) if entry in names)


def forbidden(importer: str, imported: str) -> bool:
    """Whether `importer` may not import `imported`: a higher layer, or another entry of a side-by-side layer."""
    a, b = layer_of(importer), layer_of(imported)
    beside = a == b and LAYERS[a][0] not in MIXED_LAYERS and layer_entry(importer) != layer_entry(imported)
    return b > a or beside


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Each module's import chains (breadth first, so the shortest) that end in a module of a higher layer or in
    one beside it."""
    found = []
    for start in sorted(graph):
        level, parent, queue = layer_of(start), {start: ""}, deque([start])
        while queue:
            module = queue.popleft()
            for target in sorted(graph[module]):
                if target in parent:
                    continue
                parent[target] = module
                if forbidden(start, target):
                    chain = [target]
                    while chain[-1] != start:
                        chain.append(parent[chain[-1]])
                    where = LAYERS[layer_of(target)][0]
                    where = f"{layer_entry(target)}, beside it" if layer_of(target) == level else where
                    found.append(
                        f"{start} ({LAYERS[level][0]}) imports {target} ({where}) via {' -> '.join(reversed(chain))}"
                    )
                else:
                    queue.append(target)
    return found


def render_diagram() -> str:
    """LAYERS as the text diagram of docs/architecture.md: top layer first, each importing only what is below;
    the entries of a row stand apart (`|`) or, in MIXED_LAYERS, may import one another (`,`)."""
    width = max(len(label) for label, _ in LAYERS)
    lines = []
    for label, names in reversed(LAYERS):
        shown = [n.removeprefix("tirl.") if n != "tirl" else "tirl/__init__" for n in names]
        lines.append(f"{label.ljust(width)} : {(', ' if label in MIXED_LAYERS else ' | ').join(shown)}")
    return "\n".join(lines)


def write_package(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root / "tirl"


def test_checker_follows_lazy_and_package_imports_and_skips_type_checking(tmp_path: Path) -> None:
    src = write_package(
        tmp_path,
        {
            "tirl/__init__.py": "",
            "tirl/chat/__init__.py": "from tirl.chat.template import render\n",
            "tirl/chat/template.py": "def render():\n    from ..commands.tokcheck import check\n",
            "tirl/rollout/__init__.py": "",
            "tirl/rollout/agent.py": "from tirl.chat.hermes import parse\n",
            "tirl/chat/hermes.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from tirl.cli import main\n",
            "tirl/commands/tokcheck.py": "import yaml\n",
            "tirl/train/rl.py": "def validate():\n    from tirl.eval.evaluate import evaluate\n",
            "tirl/eval/evaluate.py": "from tirl.rewards.scoring import score\n",
            "tirl/rewards/scoring.py": "",
        },
    )
    graph, external = import_graph(src)
    assert graph["tirl.chat.template"] == {"tirl", "tirl.commands.tokcheck"}  # lazy and relative
    # importing tirl.chat.hermes runs tirl/chat/__init__.py too
    assert graph["tirl.rollout.agent"] == {
        "tirl",
        "tirl.chat",
        "tirl.chat.hermes",
    }
    assert graph["tirl.chat.hermes"] == set()  # TYPE_CHECKING only
    assert external["tirl.commands.tokcheck"] == {"yaml"}
    found = upward_imports(graph)
    assert (
        "tirl.chat.template (chat, sandbox, data) imports tirl.commands.tokcheck (stages and commands) via "
        "tirl.chat.template -> tirl.commands.tokcheck" in found
    )
    assert (
        "tirl.rollout.agent (rollout, tasks) imports tirl.commands.tokcheck (stages and commands) via "
        "tirl.rollout.agent -> tirl.chat -> tirl.chat.template -> tirl.commands.tokcheck" in found
    )
    # train and eval stand side by side: a train -> eval import fails like an upward one
    assert (
        "tirl.train.rl (eval, train) imports tirl.eval.evaluate (tirl.eval, beside it) via tirl.train.rl -> "
        "tirl.eval.evaluate" in found
    )
    assert not [f for f in found if f.startswith("tirl.eval.evaluate ")]  # eval -> rewards is downward


def test_every_module_has_a_layer() -> None:
    graph, _ = import_graph(SRC)
    assert len(graph) > 100
    for module in graph:
        layer_entry(module)  # raises, naming the module, when it has none


def test_no_module_imports_a_higher_layer() -> None:
    graph, _ = import_graph(SRC)
    found = upward_imports(graph)
    assert not found, (
        "a module imports a higher layer or a package beside it (see LAYERS in tests/test_layers.py):\n"
        + "\n".join(found)
    )


def test_allowed_upward_imports_still_exist() -> None:
    """An allow-list entry whose import is gone must be dropped, so the list never hides a new violation."""
    for importer, imported in sorted(ALLOWED_UPWARD):
        path = SRC.parent / (importer.replace(".", "/") + ".py")
        names = {
            n
            for node in import_nodes(ast.parse(path.read_text()))
            for n in imported_names(node, importer, False)
        }
        assert imported in names, f"{importer} no longer imports {imported}: remove it from ALLOWED_UPWARD"
        assert forbidden(importer, imported), f"{importer} -> {imported} is allowed anyway: remove it"


def test_external_imports_per_layer() -> None:
    """The algorithm math imports only torch and the standard library (docs/STYLE.md)."""
    _, external = import_graph(SRC)
    checked = 0
    for module, names in sorted(external.items()):
        allowed = EXTERNAL_ALLOWED.get(layer_entry(module))
        if allowed is None:
            continue
        checked += 1
        assert names <= allowed, f"{module} imports {sorted(names - allowed)}; {layer_entry(module)} may not"
    assert checked >= 5


def test_architecture_page_shows_the_layer_table() -> None:
    diagram = render_diagram()
    assert diagram in ARCHITECTURE.read_text(), (
        f"docs/architecture.md must contain the layer diagram generated from LAYERS:\n{diagram}"
    )
