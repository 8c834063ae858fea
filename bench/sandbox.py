"""Sandbox throughput: LocalSandbox.run_batch (parallel) against running the same snippets one by one.

Writes bench/results/sandbox.json. A one-line snippet, so the numbers measure the per-run overhead.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

from tirl.io import atomic_write_json
from tirl.sandbox import LocalSandbox, SandboxConfig

N = 200


def main() -> dict:
    code = "print(123456 * 789)"
    out: dict = {"snippet": code, "runs": N}
    with LocalSandbox(SandboxConfig()) as sb:
        sb.run_batch([code] * 8)  # warm-up
        t = time.perf_counter()
        serial = [sb.run(code) for _ in range(N)]
        dt = time.perf_counter() - t
        out["serial"] = {
            "runs_per_s": N / dt,
            "p50_ms": 1000 * statistics.median(r.wall_time for r in serial),
        }
        t = time.perf_counter()
        batch = sb.run_batch([code] * N)
        dt = time.perf_counter() - t
        out["run_batch"] = {
            "runs_per_s": N / dt,
            "p50_ms": 1000 * statistics.median(r.wall_time for r in batch),
        }
        assert all(r.stdout == "97406784\n" for r in serial + batch)
    out["speedup"] = out["run_batch"]["runs_per_s"] / out["serial"]["runs_per_s"]
    return out


if __name__ == "__main__":
    res = main()
    atomic_write_json(Path(__file__).parent / "results" / "sandbox.json", res)
    print(json.dumps(res, indent=2))
