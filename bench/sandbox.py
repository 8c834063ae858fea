"""Sandbox throughput and latency at concurrency 1 and 16, in one run:

  (a) tirl's isolated warm pool with its default config (LocalSandbox, bubblewrap, one fork per run) on a
      one-line snippet, which it routes to the light tier (math preloaded);
  (a_heavy) the same pool on a snippet importing sympy, which it routes to the heavy tier (numpy, sympy
      preloaded);
  (b) a fresh bubblewrap-isolated interpreter per run (same namespaces and mounts, `python -I -c`);
  (b_heavy) as (b) on the sympy snippet: the service (a_heavy) replaces;
  (c) a fresh `python -c` per run without isolation (how SandboxFusion's runner executes a snippet).

Writes bench/results/sandbox.json (or `--out`). Latency is what the caller sees, from the call to the result.

`--compare REV[,REV...]` instead measures this checkout against git revisions (e.g. the commit before a change):
one process per side running that side's code, one warm worker per tier, blocks of sequential runs asked of each
side in turn (so all sides share the machine's load), reporting per run the wall time, the worker's CPU time and
its page faults (from /proc: the zygote plus the children it reaped). On a shared machine wall time swings with
the load and CPU time less; page faults do not. Writes bench/results/sandbox_compare.json (or `--out`). Usage:
  python -m bench.sandbox [--quick] [--compare REV[,REV...] [--rounds N]] [--out FILE]
"""

from __future__ import annotations

import argparse
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

from bench.common import ROOT, result_path
from bench.common import cli as common_cli
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


def probe_server() -> None:
    """One side of --compare, in its own process with this side's code: a one-worker pool per tier, then blocks of
    sequential runs on request ("light 50" on stdin -> one JSON line: wall and worker CPU seconds, page faults)."""
    pools = {}
    for tier, code, preload in (
        ("light", CODE, ("math",)),
        ("heavy", HEAVY_CODE, ("math", "numpy", "sympy")),
    ):
        cfg = SandboxConfig(preload=preload, preload_heavy=(), max_workers=1, max_runs_per_worker=10**6)
        sb = LocalSandbox(cfg)
        for _ in range(10):
            sb.run(code)
        pools[tier] = (sb, code, HEAVY_EXPECTED if tier == "heavy" else EXPECTED)
    print("ready", flush=True)
    for line in sys.stdin:
        tier, n = line.split()
        sb, code, expected = pools[tier]
        (worker,) = list(sb._all)  # one worker, never recycled (max_runs_per_worker), so its counters add up
        c0, f0 = _worker_counters(worker.proc.pid)
        t0 = time.perf_counter()
        for _ in range(int(n)):
            r = sb.run(code)
            if r.stdout != expected:
                raise RuntimeError(f"wrong output {r}")
        wall = time.perf_counter() - t0
        c1, f1 = _worker_counters(worker.proc.pid)
        print(json.dumps({"runs": int(n), "wall_s": wall, "cpu_s": c1 - c0, "faults": f1 - f0}), flush=True)
    for sb, _, _ in pools.values():
        sb.close()


def compare(revs: list[str], rounds: int, quick: bool) -> dict:
    """This checkout against git revisions `revs`: one probe process per side, all started at once, asked for
    blocks in turn (light, then heavy; the side that goes first rotates), so every side sees the same load."""
    repo = ROOT
    runs = {"light": 40 if quick else 50, "heavy": 10 if quick else 12}
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
        procs = {
            name: subprocess.Popen(
                [sys.executable, "-m", "bench.sandbox", "--probe-server"],
                env={**os.environ, "PYTHONPATH": str(src)},  # that side's tirl; bench/ from the cwd
                cwd=ROOT,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            for name, src in sides.items()
        }
        blocks: dict[str, dict[str, list[dict]]] = {name: {"light": [], "heavy": []} for name in sides}
        loads = []
        try:
            for proc in procs.values():
                if proc.stdout.readline().strip() != "ready":
                    raise RuntimeError("a probe failed to start")
            names = list(sides)
            for i in range(rounds):
                loads.append(os.getloadavg()[0])
                for tier in ("light", "heavy"):
                    for name in names[i % len(names) :] + names[: i % len(names)]:
                        procs[name].stdin.write(f"{tier} {runs[tier]}\n")
                        procs[name].stdin.flush()
                        blocks[name][tier].append(json.loads(procs[name].stdout.readline()))
        finally:
            for proc in procs.values():
                proc.stdin.close()
                proc.wait(timeout=60)
    out: dict = {"revisions": revs, "rounds": rounds, "runs_per_block": runs}
    out["load_1min_min_max"] = [min(loads), max(loads)]
    out["per_run"] = summary = per_run_summary(blocks)
    base = summary[revs[0]]
    out[f"ratio_over_{revs[0]}"] = {
        name: {
            tier: {k: round(summary[name][tier][k] / base[tier][k], 3) for k in base[tier]}
            for tier in ("light", "heavy")
        }
        for name in list(sides)[1:]
    }
    out["blocks"] = blocks
    return out


def per_run_summary(blocks: dict[str, dict[str, list[dict]]]) -> dict:
    """Each side's and tier's per-run wall time (min, median), worker CPU and page faults, from its blocks."""
    summary: dict = {}
    for name, tiers in blocks.items():
        summary[name] = {}
        for tier, rows in tiers.items():
            per_run = [r["wall_s"] / r["runs"] for r in rows]
            summary[name][tier] = {
                "wall_ms_min": round(1000 * min(per_run), 3),
                "wall_ms_median": round(1000 * statistics.median(per_run), 3),
                # /proc counts CPU in clock ticks: summed over all blocks, not per block
                "worker_cpu_ms": round(
                    1000 * sum(r["cpu_s"] for r in rows) / sum(r["runs"] for r in rows), 3
                ),
                "page_faults_median": round(statistics.median(r["faults"] / r["runs"] for r in rows), 1),
            }
    return summary


def cli(argv: list[str] | None = None) -> None:
    def arguments(ap: argparse.ArgumentParser) -> None:
        ap.add_argument("--quick", action="store_true", help="a fifth of the runs: a check, not a benchmark")
        ap.add_argument("--compare", metavar="REV[,REV...]", help="this checkout against git revisions")
        ap.add_argument(
            "--rounds", type=int, default=20, help="--compare: rounds of blocks asked of each side"
        )
        ap.add_argument(
            "--probe-server", action="store_true", help=argparse.SUPPRESS
        )  # one side of --compare

    def run(args: argparse.Namespace) -> dict | None:
        if args.probe_server:
            return probe_server()
        if args.compare:
            args.out = args.out or str(result_path("sandbox_compare"))
            return compare(args.compare.split(","), args.rounds, quick=args.quick)
        return main(quick=args.quick)

    common_cli("sandbox", __doc__, run, argv, arguments=arguments, shown=lambda r: {k: v for k, v in r.items() if k != "blocks"},
               formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip


if __name__ == "__main__":
    cli()
