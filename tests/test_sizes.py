"""Small modules (docs/STYLE.md): no source file over 500 lines, no function over 60, so a reader never gets
lost; the benchmarks in bench/ are held to the same rule as src/."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "tirl"
TREES = [SRC, ROOT / "bench"]
MAX_FILE_LINES = 500
MAX_FUNCTION_LINES = 60


@pytest.mark.parametrize("tree", TREES, ids=lambda p: p.name)
def test_no_source_file_over_500_lines(tree: Path) -> None:
    long = {
        str(p.relative_to(tree)): n
        for p in tree.rglob("*.py")
        if (n := p.read_text().count("\n")) > MAX_FILE_LINES
    }
    assert not long, f"files over {MAX_FILE_LINES} lines (split them by their jobs): {long}"


@pytest.mark.parametrize("tree", TREES, ids=lambda p: p.name)
def test_no_function_over_60_lines(tree: Path) -> None:
    long = {}
    for p in tree.rglob("*.py"):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long[f"{p.relative_to(tree)}:{node.lineno} {node.name}"] = n
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"
