"""Sandbox throughput and latency of a one-line snippet at concurrency 1 and 16, three ways, in one run:

  (a) tirl's isolated warm pool (LocalSandbox, bubblewrap, math/numpy/sympy preloaded, one fork per run);
  (a2) the same pool preloading only math: a smaller interpreter is cheaper to fork and to tear down;
  (b) a fresh bubblewrap-isolated interpreter per run (same namespaces and mounts, `python -I -c`);
  (c) a fresh `python -c` per run without isolation (how SandboxFusion's runner executes a snippet);
  (b2) as (b), but importing the modules the pool preloads (math, numpy, sympy) first: the same service as (a).

Writes bench/results/sandbox.json. Latency is what the caller sees, from the call to the result. Usage:
  python bench/sandbox.py [--quick]
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tirl.io import atomic_write_json
from tirl.sandbox import LocalSandbox, SandboxConfig
from tirl.sandbox.isolation import ENV, worker_command

CODE = "print(123456 * 789)"
EXPECTED = "97406784\n"


def measure(run_one: Callable[[], str], runs: int, concurrency: int) -> dict:
    """Call `run_one` `runs` times from `concurrency` threads; every output must be correct."""

    def timed(_: int) -> float:
        t = time.perf_counter()
        out = run_one()
        if out != EXPECTED:
            raise RuntimeError(f"wrong output {out!r}")
        return time.perf_counter() - t

    for _ in range(min(4, runs)):  # warm-up
        run_one()
    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as ex:
        lat = sorted(ex.map(timed, range(runs)))
    wall = time.perf_counter() - t0
    return {
        "runs": runs,
        "concurrency": concurrency,
        "runs_per_s": round(runs / wall, 1),
        "p50_ms": round(1000 * statistics.median(lat), 2),
        "p99_ms": round(1000 * lat[min(len(lat) - 1, int(0.99 * len(lat)))], 2),
    }


def fresh_process(argv: list[str], env: dict[str, str] | None) -> Callable[[], str]:
    def run() -> str:
        return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=30, check=False).stdout

    return run


def main(quick: bool = False) -> dict:
    scale = 0.2 if quick else 1.0
    n_pool, n_fresh = int(3000 * scale), int(200 * scale)
    out: dict = {
        "snippet": CODE,
        "machine_cpus": os.cpu_count(),
        "load_avg_before": os.getloadavg(),
        "results": {},
    }
    config = SandboxConfig()
    pools = {
        "a_isolated_warm_pool": config,
        "a2_isolated_warm_pool_math_only": SandboxConfig(preload=("math",)),
    }
    for name, cfg in pools.items():
        with LocalSandbox(cfg) as sb:
            out["pool_workers"] = sb.workers
            pool = out["results"][name] = {}
            for c in (1, 16):
                pool[f"c{c}"] = measure(lambda: sb.run(CODE).stdout, n_pool if c > 1 else n_pool // 3, c)
    time.sleep(1)  # the pool's workers are gone before the fresh-process runs start
    head = worker_command(config, sys.executable, "{}")[:-2]  # bwrap ... python flags, without zygote.py
    preload = f"import {', '.join(config.preload)}\n"
    fresh = {
        "b_fresh_bwrap_interpreter": ([*head, "-c", CODE], None, n_fresh),
        "b2_fresh_bwrap_interpreter_same_preloads": (
            [*head, "-c", preload + CODE],
            None,
            max(8, n_fresh // 10),
        ),
        "c_fresh_python_c": ([sys.executable, "-c", CODE], ENV, n_fresh),
    }
    for name, (argv, env, n) in fresh.items():
        res = out["results"][name] = {}
        for c in (1, 16):
            res[f"c{c}"] = measure(fresh_process(argv, env), n if c == 1 else 2 * n, c)
    a, b = out["results"]["a_isolated_warm_pool"], out["results"]["b_fresh_bwrap_interpreter"]
    b2 = out["results"]["b2_fresh_bwrap_interpreter_same_preloads"]
    out["load_avg_after"] = os.getloadavg()  # other jobs on the machine make every figure lower
    out["speedup_a_over_b"] = {k: round(a[k]["runs_per_s"] / b[k]["runs_per_s"], 1) for k in ("c1", "c16")}
    a2 = out["results"]["a2_isolated_warm_pool_math_only"]
    out["speedup_a_over_b2"] = {k: round(a[k]["runs_per_s"] / b2[k]["runs_per_s"], 1) for k in ("c1", "c16")}
    out["speedup_a2_over_b"] = {k: round(a2[k]["runs_per_s"] / b[k]["runs_per_s"], 1) for k in ("c1", "c16")}
    return out


if __name__ == "__main__":
    res = main(quick="--quick" in sys.argv)
    atomic_write_json(Path(__file__).parent / "results" / "sandbox.json", res)
    print(json.dumps(res, indent=2))
