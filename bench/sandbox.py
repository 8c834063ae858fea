"""Sandbox throughput and latency at concurrency 1 and 16, in one run:

  (a) tirl's isolated warm pool with its default config (LocalSandbox, bubblewrap, one fork per run) on a
      one-line snippet, which it routes to the light tier (math preloaded);
  (a_heavy) the same pool on a snippet importing sympy, which it routes to the heavy tier (numpy, sympy
      preloaded);
  (b) a fresh bubblewrap-isolated interpreter per run (same namespaces and mounts, `python -I -c`);
  (b_heavy) as (b) on the sympy snippet: the service (a_heavy) replaces;
  (c) a fresh `python -c` per run without isolation (how SandboxFusion's runner executes a snippet).

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
HEAVY_CODE = "import sympy; print(sympy.Integer(2)**10)"
HEAVY_EXPECTED = "1024\n"


def measure(run_one: Callable[[], str], runs: int, concurrency: int, expected: str = EXPECTED) -> dict:
    """Call `run_one` `runs` times from `concurrency` threads; every output must be correct."""

    def timed(_: int) -> float:
        t = time.perf_counter()
        out = run_one()
        if out != expected:
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
    out["heavy_snippet"] = HEAVY_CODE
    out["preload"], out["preload_heavy"] = list(config.preload), list(config.preload_heavy)
    with LocalSandbox(config) as sb:
        out["pool_workers"] = sb.workers  # both tiers
        per_tier = sb.workers // 2
        for name, code, expected, tier in (
            ("a_isolated_warm_pool", CODE, EXPECTED, "light"),
            ("a_heavy_tier_sympy_snippet", HEAVY_CODE, HEAVY_EXPECTED, "heavy"),
        ):
            sb.run(code)  # the heavy tier starts on its first snippet: wait until all its workers are up
            deadline = time.monotonic() + 120
            while sb.stats()[f"{tier}_idle"] < per_tier and time.monotonic() < deadline:
                time.sleep(0.1)
            pool = out["results"][name] = {}
            for c in (1, 16):
                n = n_pool if c > 1 else n_pool // 3
                pool[f"c{c}"] = measure(lambda code=code: sb.run(code).stdout, n, c, expected)
        out["pool_stats"] = sb.stats()  # runs routed to each tier
    time.sleep(1)  # the pool's workers are gone before the fresh-process runs start
    head = worker_command(config, sys.executable, "{}")[:-2]  # bwrap ... python flags, without zygote.py
    fresh = {
        "b_fresh_bwrap_interpreter": ([*head, "-c", CODE], None, n_fresh, EXPECTED),
        "b_heavy_fresh_bwrap_interpreter_sympy_snippet": (
            [*head, "-c", HEAVY_CODE],
            None,
            max(8, n_fresh // 10),
            HEAVY_EXPECTED,
        ),
        "c_fresh_python_c": ([sys.executable, "-c", CODE], ENV, n_fresh, EXPECTED),
    }
    for name, (argv, env, n, expected) in fresh.items():
        res = out["results"][name] = {}
        for c in (1, 16):
            res[f"c{c}"] = measure(fresh_process(argv, env), n if c == 1 else 2 * n, c, expected)
    r = out["results"]
    out["load_avg_after"] = os.getloadavg()  # other jobs on the machine make every figure lower

    def speedup(x: str, y: str) -> dict:
        return {k: round(r[x][k]["runs_per_s"] / r[y][k]["runs_per_s"], 1) for k in ("c1", "c16")}

    out["speedup_a_over_b"] = speedup("a_isolated_warm_pool", "b_fresh_bwrap_interpreter")
    out["speedup_a_heavy_over_b_heavy"] = speedup(
        "a_heavy_tier_sympy_snippet", "b_heavy_fresh_bwrap_interpreter_sympy_snippet"
    )
    return out


if __name__ == "__main__":
    res = main(quick="--quick" in sys.argv)
    atomic_write_json(Path(__file__).parent / "results" / "sandbox.json", res)
    print(json.dumps(res, indent=2))
