"""Tier routing (pure) and the config keys that define the tiers."""

from __future__ import annotations

import time

import pytest

from tirl.sandbox import SandboxConfig
from tirl.sandbox.routing import heavy_import_pattern, needs_heavy

PATTERN = heavy_import_pattern(["numpy", "sympy"])


@pytest.mark.parametrize(
    "code",
    [
        "import sympy",
        "import numpy as np\nprint(np.arange(3))",
        "import os, sympy as sp",
        "from sympy import symbols, solve",
        "from sympy.abc import x",
        "  from numpy.linalg import inv",
        "x = 1; import numpy",
        "import numpy.linalg",
        "def f():\n    import sympy\n    return sympy.Integer(1)",
        "m = __import__('sympy')",
        "import importlib\nnp = importlib.import_module('numpy')",
        "from numpy import (\n    array,\n)",
        "print(1)\nimport\tsympy",
    ],
)
def test_snippets_importing_a_heavy_module_go_heavy(code: str) -> None:
    assert needs_heavy(code, PATTERN)


@pytest.mark.parametrize(
    "code",
    [
        "print(123456 * 789)",
        "import math\nprint(math.factorial(20))",
        "from math import gcd\nimport itertools, fractions",
        "import sys\nprint('sympy' in sys.modules)",
        "import sys; print('numpy' in sys.modules)",
        "import mynumpy",
        "import sympyx",
        "from mysympy import x",
        "import jax.numpy as jnp",
        "numpy = 3\nprint(numpy)",
        "",
    ],
)
def test_other_snippets_stay_light(code: str) -> None:
    assert not needs_heavy(code, PATTERN)


def test_no_heavy_modules_means_one_tier() -> None:
    assert heavy_import_pattern([]) is None
    assert not needs_heavy("import sympy", None)


def test_submodule_in_the_list_routes_by_its_top_level_package() -> None:
    pattern = heavy_import_pattern(["scipy.optimize"])
    assert needs_heavy("from scipy import stats", pattern)
    assert not needs_heavy("import numpy", pattern)


def test_config_defaults_and_validation() -> None:
    cfg = SandboxConfig()
    assert cfg.preload == ("math",) and cfg.preload_heavy == ("numpy", "sympy")
    with pytest.raises(ValueError, match="in both preload and preload_heavy"):
        SandboxConfig(preload=("math", "numpy"))
    with pytest.raises(ValueError, match="preload_heavy: 'num py' is not a module name"):
        SandboxConfig(preload_heavy=("num py",))
    assert SandboxConfig(preload=("math", "numpy", "sympy"), preload_heavy=()).preload_heavy == ()


def test_routing_is_linear_on_a_pathological_line() -> None:
    """Many `import`s on one line without a heavy module: the old pattern rescanned the line from each one
    (100 KB took ~17 s, holding the GIL of the server routing it)."""
    code = "import " * 15_000  # ~100 KB, one line
    t = time.perf_counter()
    assert not needs_heavy(code, PATTERN)
    assert needs_heavy(code + "numpy", PATTERN)
    assert time.perf_counter() - t < 0.5  # measured ~10 ms
