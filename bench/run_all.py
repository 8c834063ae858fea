"""`make bench`: every benchmark, results as JSON in bench/results/, and a side-by-side summary."""

from __future__ import annotations

import runpy
from pathlib import Path

HERE = Path(__file__).parent

if __name__ == "__main__":
    for name in "engine sandbox rewards analyze tools rollout_async linear_kernels engines train".split():
        print(f"== {name}")
        runpy.run_path(str(HERE / f"{name}.py"), run_name="__main__")
