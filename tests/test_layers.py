"""The import layers of `src/tirl`: no module imports a module of a higher layer, not even lazily or for an
annotation, nor one that stands beside it in its own layer (train and eval, rollout and tasks: neither of a pair
knows the other); and no two folders, and no two modules, import each other.

A lower layer that reaches up (directly, through a package `__init__`, through an import inside a function, or
under `if TYPE_CHECKING:` to name a class in a type hint) turns the layers into a tangle: the next engine, trainer
or command then touches code it should not know about. Imports are read with `ast`, so lazy and annotation-only
imports count. `LAYERS` is also the diagram of docs/architecture.md (a test keeps the two the same). The algorithm
math has a stricter rule on top (docs/STYLE.md): it imports only torch and the standard library.
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
# the longest matching entry places a module (the run config sits below the stages and front ends of its
# package). Every `tirl <command>` front end is in commands/ (the demo's, above it, in demo/), so each package
# below sits in one layer whole. The entries of one layer stand side by side and do not
# import one another (rewards scores text against a problem row and knows no trajectory; the episode driver,
# rollout/agent/episodes.py, scores through it; the RL trainer and the evaluator share only what lies below them, and
# in-training validation is wired by the RL stage above both), except in the layers of MIXED_LAYERS.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("package root", ("tirl",)),
    ("foundation", ("tirl.core", "tirl.algorithms")),
    ("chat, sandbox, data", ("tirl.chat", "tirl.sandbox", "tirl.data")),
    ("tools, models, rewards", ("tirl.tools", "tirl.models", "tirl.rewards")),
    ("rollout, tasks", ("tirl.rollout", "tirl.tasks")),
    ("eval, train, launch", ("tirl.eval", "tirl.train", "tirl.launch")),
    ("run config", ("tirl.commands.run_config",)),
    ("stages and commands", ("tirl.commands",)),
    ("demo", ("tirl.demo",)),
    ("cli", ("tirl.cli", "tirl.__main__")),
)

# Layers whose entries may import one another: `__main__` runs the cli.
MIXED_LAYERS = {"cli"}

# Known upward imports, each named with the change that removes it: (importing module, imported module).
# Upward imports allowed by name (none: gather-for-export lives in train/fsdp.py, so models/ never imports train/).
ALLOWED_UPWARD: set[tuple[str, str]] = set()

# Third-party imports allowed per layer entry (an entry not listed may import any installed package).
EXTERNAL_ALLOWED = {"tirl.algorithms": {"torch", "__future__"} | set(sys.stdlib_module_names)}


def module_name(path: Path, src: Path) -> str:
    parts = list(path.relative_to(src.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_nodes(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement, at any depth: inside functions and under `if TYPE_CHECKING:` too."""
    return [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]


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


def import_graph(src: Path, *, packages: bool = True) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(module -> tirl modules its execution imports, module -> top-level names of its external imports).

    Importing `a.b.c` runs `a/__init__.py` and `a/b/__init__.py` too, so those are edges as well (without
    `packages`, only the module an import names: what the module itself knows)."""
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
                if packages:
                    graph[module] |= {".".join(parts[:i]) for i in range(1, len(parts) + 1)} & paths.keys()
                else:  # the longest existing module the name starts with (`from a import b`: a.b, or a)
                    graph[module] |= next(
                        ({n} for i in range(len(parts), 0, -1) if (n := ".".join(parts[:i])) in paths), set()
                    )
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


def folder(module: str, src: Path) -> str:
    """The top-level folder (package) of `module`: `tirl.rollout.engines.torch.engine` -> `tirl.rollout`; the modules at
    the root (cli, __main__) are the folder `tirl`."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 and (src / parts[1]).is_dir() else parts[0]


def mutual_imports(src: Path) -> tuple[list[str], list[str]]:
    """(folder pairs, module pairs) that import each other: each pair once, with one import each way for the
    folders. Only the modules an import names count (the package `__init__` it also runs is no knowledge)."""
    graph, _ = import_graph(src, packages=False)
    arrows: dict[tuple[str, str], str] = {}
    for a in sorted(graph):
        for b in sorted(graph[a]):
            fa, fb = folder(a, src), folder(b, src)
            if fa != fb:
                arrows.setdefault((fa, fb), f"{a} -> {b}")
    folders = [
        f"{fa} <-> {fb}: {arrows[(fa, fb)]}, {arrows[(fb, fa)]}"
        for fa, fb in sorted(arrows)
        if fa < fb and (fb, fa) in arrows
    ]
    modules = [
        f"{a} <-> {b}" for a in sorted(graph) for b in sorted(graph[a]) if a < b and a in graph.get(b, ())
    ]
    return folders, modules


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


def test_checker_follows_lazy_package_and_type_checking_imports(tmp_path: Path) -> None:
    src = write_package(
        tmp_path,
        {
            "tirl/__init__.py": "",
            "tirl/chat/__init__.py": "from tirl.chat.template import render\n",
            "tirl/chat/template.py": "def render():\n    from ..commands.tokcheck import check\n",
            "tirl/rollout/__init__.py": "",
            "tirl/rollout/agent.py": "from tirl.chat.hermes import parse\n",
            "tirl/chat/hermes.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from tirl.demo import run\n",
            "tirl/demo/__init__.py": "",
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
    assert graph["tirl.chat.hermes"] == {"tirl", "tirl.demo"}  # an annotation's import counts too
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
        "tirl.train.rl (eval, train, launch) imports tirl.eval.evaluate (tirl.eval, beside it) via tirl.train.rl -> "
        "tirl.eval.evaluate" in found
    )
    assert (
        "tirl.chat.hermes (chat, sandbox, data) imports tirl.demo (demo) via tirl.chat.hermes -> tirl.demo"
        in found
    )
    assert not [f for f in found if f.startswith("tirl.eval.evaluate ")]  # eval -> rewards is downward


def test_pair_checker_finds_folders_and_modules_that_import_each_other(tmp_path: Path) -> None:
    src = write_package(
        tmp_path,
        {
            "tirl/__init__.py": "",
            "tirl/cli.py": "from tirl.data.rows import read\n",  # the root imports down: no pair with tirl/
            "tirl/data/__init__.py": "",
            "tirl/data/rows.py": "import tirl.data.schema\n\n\ndef read():\n    from tirl.tasks.task import Task\n",
            "tirl/data/schema.py": "from tirl.data import rows\n",
            "tirl/tasks/__init__.py": "",
            "tirl/tasks/task.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from tirl.data.schema import S\n",
            "tirl/rollout/__init__.py": "",
            "tirl/rollout/engine.py": "from tirl.rollout.decode import graph\n",
            "tirl/rollout/decode.py": "from tirl.rollout import engine\n",
        },
    )
    folders, modules = mutual_imports(src)
    assert folders == [
        "tirl.data <-> tirl.tasks: tirl.data.rows -> tirl.tasks.task, tirl.tasks.task -> tirl.data.schema"
    ]
    assert modules == ["tirl.data.rows <-> tirl.data.schema", "tirl.rollout.decode <-> tirl.rollout.engine"]


def test_no_two_folders_import_each_other() -> None:
    folders, _ = mutual_imports(SRC)
    assert not folders, "these folders import each other (one import each way):\n" + "\n".join(folders)


def test_no_two_modules_import_each_other() -> None:
    _, modules = mutual_imports(SRC)
    assert not modules, "these modules import each other:\n" + "\n".join(modules)


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
