"""The algorithm math imports only torch and the standard library (STYLE.md)."""

import ast
import sys
from pathlib import Path

import tirl.algorithms

ALLOWED = {"torch", "__future__"} | set(sys.stdlib_module_names)
ALGORITHMS_DIR = Path(tirl.algorithms.__file__).parent


def foreign_imports(source: str) -> set[str]:
    """Top-level names of imports that are neither allowed nor relative within the package."""
    bad = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 1:
                continue  # from .x import y: inside tirl.algorithms
            if node.level > 1:
                bad.add("." * node.level + (node.module or ""))  # escapes the package
                continue
            names = [node.module or ""]
        else:
            continue
        for name in names:
            if name.split(".")[0] not in ALLOWED and not name.startswith("tirl.algorithms"):
                bad.add(name)
    return bad


def test_checker_catches_foreign_imports() -> None:
    source = "import numpy as np\nfrom transformers import AutoModel\nfrom ..train import x\n"
    source += "def f():\n    import yaml\n"
    assert foreign_imports(source) == {"numpy", "transformers", "..train", "yaml"}
    assert foreign_imports("import torch.nn\nimport math\nfrom .losses import aggregate\n") == set()


def test_algorithms_import_only_torch_and_stdlib() -> None:
    files = sorted(ALGORITHMS_DIR.glob("*.py"))
    assert len(files) >= 4
    for path in files:
        assert foreign_imports(path.read_text()) == set(), path.name
