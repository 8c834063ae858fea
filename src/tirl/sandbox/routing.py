"""Which warm-worker tier a snippet runs on: a pure, conservative static check of the modules it imports.

A zygote that has numpy and sympy imported costs ~5x more per fork (page tables and teardown of a larger
address space) than one with only math, so snippets that do not need them run on a light tier. The check is a
regex, not a parse: it runs on the host for every snippet (a few microseconds) and must accept code that does not
even compile. It errs towards the heavy tier (a word `import ... sympy` in a string or comment routes there too);
a snippet it misses (say `getattr(__builtins__, "__imp" + "ort__")("sympy")`) still works on the light tier,
where it imports the module itself, only slower. Routing never changes a result, only its speed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["heavy_import_pattern", "needs_heavy"]


def heavy_import_pattern(modules: Iterable[str]) -> re.Pattern[str] | None:
    """A regex matching any import of `modules` (or their submodules); None when there is nothing to match.

    Matches `import a, numpy as np`, `from sympy.abc import x`, `x = 1; import numpy`, and the dynamic forms
    `__import__("sympy")` and `importlib.import_module('numpy.linalg')`: `import` before the module name in the
    same statement (same line, no `;` between), or `from <module>`.
    """
    tops = sorted({m.strip().split(".")[0] for m in modules if m.strip()})
    if not tops:
        return None
    names = "|".join(re.escape(t) for t in tops)
    # The import branch starts only at a statement boundary and pins the statement's first `import` atomically:
    # a bare `import[^\n;]*?name` is retried from every `import` in a line, quadratic in the line's length (a
    # 160 KB line of `import import ...` took 44 s, holding the GIL of the server that routes it).
    return re.compile(rf"\bfrom\s+(?:{names})\b|(?:^|[\n;])(?>[^\n;]*?import)[^\n;]*?(?<![\w.])(?:{names})\b")


def needs_heavy(code: str, pattern: re.Pattern[str] | None) -> bool:
    """True when `code` may import a heavy-tier module (then it should run on the heavy tier)."""
    return pattern is not None and pattern.search(code) is not None
