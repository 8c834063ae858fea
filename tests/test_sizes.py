"""Small modules (docs/STYLE.md): no source file over 500 lines, no function over 60, so a reader never gets
lost."""

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "tirl"
MAX_FILE_LINES = 500
MAX_FUNCTION_LINES = 60


def test_no_source_file_over_500_lines() -> None:
    long = {
        str(p.relative_to(SRC)): n
        for p in SRC.rglob("*.py")
        if (n := p.read_text().count("\n")) > MAX_FILE_LINES
    }
    assert not long, f"files over {MAX_FILE_LINES} lines (split them by their jobs): {long}"


def test_no_function_over_60_lines() -> None:
    long = {}
    for p in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long[f"{p.relative_to(SRC)}:{node.lineno} {node.name}"] = n
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"
