"""docs/architecture.md names only modules that exist: every path, file name and `tirl.` module it puts in backticks
is found under src/tirl (a path may be given from any folder down, as the page does inside a package's paragraph;
NAME stands for the reader's own)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "tirl"
PAGE = ROOT / "docs" / "architecture.md"


def _missing(text: str) -> list[str]:
    files = [p.relative_to(SRC).as_posix() for p in SRC.rglob("*") if "__pycache__" not in p.parts]
    dirs = {f + "/" for f in files if (SRC / f).is_dir()}
    known = set(files) | dirs
    missing = set()
    for token in re.findall(r"`([^`\s]+)`", text):
        name = token.split("(")[0].rstrip(",.:")
        if "NAME" in name:
            continue
        if re.fullmatch(r"[\w.-]+(/[\w.-]+)*/?", name) and (name.endswith(".py") or name.endswith("/")):
            local = name.removeprefix("src/tirl/")
            if not (ROOT / name).exists() and not any(k == local or k.endswith("/" + local) for k in known):
                missing.add(name)
        elif re.fullmatch(r"tirl(\.\w+)+", name):
            parts = name.split(".")[1:]
            if not any(
                SRC.joinpath(*parts[:k]).with_suffix(".py").is_file()
                or (SRC.joinpath(*parts[:k]) / "__init__.py").is_file()
                for k in range(len(parts), 0, -1)
            ):
                missing.add(name)
    return sorted(missing)


def test_the_checker_finds_a_module_that_is_not_there() -> None:
    page = "`tasks/gsm8k/task.py`, `task.py`, `tirl.tasks.gsm8k`, `tasks/NAME/` and `demo/nowhere.py`, `tirl.nope`"
    assert _missing(page) == ["demo/nowhere.py", "tirl.nope"]


def test_every_module_the_architecture_page_names_exists() -> None:
    assert _missing(PAGE.read_text()) == []
