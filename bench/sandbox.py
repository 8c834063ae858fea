"""Sandbox throughput and latency at concurrency 1 and 16, in one run:

  (a) tirl's isolated warm pool with its default config (LocalSandbox, bubblewrap, one fork per run) on a
      one-line snippet, which it routes to the light tier (math preloaded);
  (a_heavy) the same pool on a snippet importing sympy, which it routes to the heavy tier (numpy, sympy
      preloaded);
  (b) a fresh bubblewrap-isolated interpreter per run (same namespaces and mounts, `python -I -c`);
  (b_heavy) as (b) on the sympy snippet: the service (a_heavy) replaces;
  (c) a fresh `python -c` per run without isolation (how SandboxFusion's runner executes a snippet).

Writes bench/results/sandbox.json. Latency is what the caller sees, from the call to the result.

`--compare REV[,REV...]` instead measures this checkout against git revisions (e.g. the commit before a change)
in alternating subprocesses, one warm worker per tier, sequential runs: wall ms per run, the worker's CPU ms per
run and its page faults per run (from /proc: the zygote plus the children it reaped). On a shared machine wall
time swings with the load; CPU and page faults much less, and page faults not at all. Writes
bench/results/sandbox_compare.json. Usage:
  python bench/sandbox.py [--quick] [--compare REV [--rounds N]]
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tirl.io import atomic_write_json
from tirl.sandbox import LocalSandbox, SandboxConfig
from tirl.sandbox.isolation import ENV, worker_command
from tirl.sandbox.routing import heavy_import_pattern, needs_heavy

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
    routed = "x = 0\nfor i in range(10):\n    x += i * i\nprint(x)\n" * 20  # ~800 chars, no heavy import
    pattern = heavy_import_pattern(config.preload_heavy)
    t0 = time.perf_counter()
    for _ in range(2000):
        needs_heavy(routed, pattern)
    out["routing_us_per_800_char_snippet"] = round(1e6 * (time.perf_counter() - t0) / 2000, 2)
    out["load_avg_after"] = os.getloadavg()  # other jobs on the machine make every figure lower

    def speedup(x: str, y: str) -> dict:
        return {k: round(r[x][k]["runs_per_s"] / r[y][k]["runs_per_s"], 1) for k in ("c1", "c16")}

    out["speedup_a_over_b"] = speedup("a_isolated_warm_pool", "b_fresh_bwrap_interpreter")
    out["speedup_a_heavy_over_b_heavy"] = speedup(
        "a_heavy_tier_sympy_snippet", "b_heavy_fresh_bwrap_interpreter_sympy_snippet"
    )
    return out


def _worker_counters(pid: int) -> tuple[float, int]:
    """CPU seconds and minor page faults of the worker tree under `pid` (bwrap): each process with the children
    it has reaped (the zygote reaps every snippet)."""
    cpu, faults, todo = 0.0, 0, [pid]
    while todo:
        p = todo.pop()
        try:
            f = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            todo += [int(c) for c in Path(f"/proc/{p}/task/{p}/children").read_text().split()]
        except OSError:
            continue
        faults += int(f[7]) + int(f[8])  # minflt, cminflt
        cpu += sum(int(x) for x in f[11:15]) / os.sysconf("SC_CLK_TCK")  # utime stime cutime cstime
    return cpu, faults


def probe(blocks: int, runs: int) -> dict:
    """One side of --compare, in its own process: per tier, one warm worker, `blocks` x `runs` sequential runs."""
    out = {}
    for tier, code, expected, heavy in (
        ("light", CODE, EXPECTED, ()),
        ("heavy", HEAVY_CODE, HEAVY_EXPECTED, ("numpy", "sympy")),
    ):
        # one tier per pool (the snippet's own), so the worker measured is the only one
        preload = ("math", *heavy)
        cfg = SandboxConfig(preload=preload, preload_heavy=(), max_workers=1, max_runs_per_worker=10**6)
        n = runs if tier == "light" else max(5, runs // 4)
        with LocalSandbox(cfg) as sb:
            for _ in range(10):
                sb.run(code)
            (worker,) = list(sb._all)
            wall, faults = [], []
            cpu0, _ = _worker_counters(worker.proc.pid)
            for _ in range(blocks):
                _, f0 = _worker_counters(worker.proc.pid)
                t0 = time.perf_counter()
                for _ in range(n):
                    r = sb.run(code)
                wall.append(1000 * (time.perf_counter() - t0) / n)
                faults.append((_worker_counters(worker.proc.pid)[1] - f0) / n)
                if r.stdout != expected:
                    raise RuntimeError(f"wrong output {r}")
            cpu = (
                1000 * (_worker_counters(worker.proc.pid)[0] - cpu0) / (blocks * n)
            )  # ticks: sum, not per block
        out[tier] = {
            "wall_ms_min": round(min(wall), 3),
            "wall_ms_median": round(statistics.median(wall), 3),
            "worker_cpu_ms": round(cpu, 3),
            "page_faults_per_run_median": round(statistics.median(faults), 1),
        }
    return out


def compare(revs: list[str], rounds: int, quick: bool) -> dict:
    """This checkout against git revisions `revs`, alternating A, B, C, A, B, C... so all see the same load;
    ratios are against the first revision."""
    repo = Path(__file__).resolve().parents[1]
    blocks, runs = (4, 40) if quick else (8, 50)
    with tempfile.TemporaryDirectory(prefix="tirl-bench-") as tmp:
        sides = {}
        for rev in revs:
            archive = subprocess.run(
                ["git", "-C", str(repo), "archive", rev, "src"], capture_output=True, check=True
            )
            (Path(tmp) / rev).mkdir()
            subprocess.run(["tar", "-x", "-C", str(Path(tmp) / rev)], input=archive.stdout, check=True)
            sides[rev] = Path(tmp) / rev / "src"
        sides["this checkout"] = repo / "src"
        samples: dict[str, list[dict]] = {name: [] for name in sides}
        for _ in range(rounds):
            for name, src in sides.items():
                cmd = [sys.executable, __file__, "--probe", str(blocks), str(runs)]
                env = {**os.environ, "PYTHONPATH": str(src)}
                res = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True, timeout=600)
                samples[name].append({**json.loads(res.stdout), "load_1min": os.getloadavg()[0]})
    out: dict = {"revisions": revs, "rounds": rounds, "blocks": blocks, "runs_per_block": runs}
    out["machine_cpus"] = os.cpu_count()
    summary = out["median_over_rounds"] = {}
    for name, rows in samples.items():
        summary[name] = {
            tier: {k: round(statistics.median(r[tier][k] for r in rows), 3) for k in rows[0][tier]}
            for tier in ("light", "heavy")
        }
    base = summary[revs[0]]
    out[f"ratio_over_{revs[0]}"] = {
        name: {
            tier: {k: round(summary[name][tier][k] / base[tier][k], 3) for k in base[tier]}
            for tier in ("light", "heavy")
        }
        for name in list(sides)[1:]
    }
    out["samples"] = samples
    return out


if __name__ == "__main__":
    if "--probe" in sys.argv:
        i = sys.argv.index("--probe")
        print(json.dumps(probe(int(sys.argv[i + 1]), int(sys.argv[i + 2]))))
    elif "--compare" in sys.argv:
        i = sys.argv.index("--compare")
        n_rounds = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 5
        res = compare(sys.argv[i + 1].split(","), n_rounds, quick="--quick" in sys.argv)
        atomic_write_json(Path(__file__).parent / "results" / "sandbox_compare.json", res)
        print(json.dumps({k: v for k, v in res.items() if k != "samples"}, indent=2))
    else:
        res = main(quick="--quick" in sys.argv)
        atomic_write_json(Path(__file__).parent / "results" / "sandbox.json", res)
        print(json.dumps(res, indent=2))
