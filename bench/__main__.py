"""`python -m bench` (`make bench`): run the benchmarks of bench/registry.py, each in its own process.

    python -m bench NAME [ARGS ...]        one benchmark, ARGS passed on (`python -m bench NAME --help`)
    python -m bench --list                 the registry: names, expected minutes, what each needs
    python -m bench --all                  every benchmark that needs no argument, in the registry's order
                                           (about two hours; rewrites the tracked results in bench/results/)
    python -m bench --all --max-minutes 5  only those expected to take at most 5 minutes

With no argument it prints the registry and this usage and exits 2: the full suite is a choice, never a default.
Each writes its JSON to bench/results/ with the machine inside. A fresh process per benchmark keeps its peak
memory and torch's thread settings its own; one that fails is reported at the end and the others still run.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

from bench.common import ROOT
from bench.registry import BENCHMARKS, BY_NAME, Benchmark, table


def run(bench: Benchmark, args: list[str]) -> tuple[int, float]:
    """`python -m bench.NAME ARGS` from the repository root; its exit code and wall seconds."""
    print(f"== {bench.name} (about {bench.minutes:g} min)", flush=True)
    t0 = time.perf_counter()
    rc = subprocess.run([sys.executable, "-m", f"bench.{bench.name}", *args], cwd=ROOT).returncode
    return rc, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench",
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawTextHelpFormatter,
    )
    ap.add_argument(
        "name", nargs="?", help="one benchmark (see --list); the arguments after it are passed on"
    )
    ap.add_argument("--list", action="store_true", help="list the benchmarks with their expected minutes")
    ap.add_argument("--all", action="store_true", help="run every benchmark that needs no argument")
    ap.add_argument(
        "--max-minutes", type=float, default=None, help="with --all: skip benchmarks expected to take longer"
    )
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in BY_NAME:  # everything after the name is the benchmark's own (its --help too)
        return run(BY_NAME[argv[0]], argv[1:])[0]
    args, rest = ap.parse_known_args(argv)
    if args.list:
        print(table())
        return 0
    if args.name:
        ap.error(f"no benchmark {args.name!r}; one of: {', '.join(BY_NAME)}")
    if rest:
        ap.error(f"arguments {rest} need a benchmark name")
    if not args.all:  # the suite takes hours and rewrites tracked result files: run it only when asked
        print(f"{table()}\n\n{__doc__}", file=sys.stderr)
        ap.error("name a benchmark, or pass --all to run every one that needs no argument")
    chosen = [
        b for b in BENCHMARKS if b.default and (args.max_minutes is None or b.minutes <= args.max_minutes)
    ]
    done = [(b, *run(b, [])) for b in chosen]
    print(f"\n{'benchmark':<16} {'expected':>9} {'took':>9}  result")
    for b, rc, s in done:
        print(f"{b.name:<16} {b.minutes:>7g} m {s / 60:>7.1f} m  {'ok' if rc == 0 else f'failed ({rc})'}")
    return int(any(rc for _, rc, _ in done))


if __name__ == "__main__":
    sys.exit(main())
