"""`tirl demo` stage by stage: an earlier commit against this checkout, one after the other on one machine.

`--before REF` checks REF out into a temporary git worktree and runs its `tirl demo` (seed 0) with this
environment's Python (`PYTHONPATH=<worktree>/src`), then this checkout's; each under `/usr/bin/time -v` when it
exists (wall clock, CPU time, peak RSS, minor page faults), each stage's seconds and pass@1 from its `report.json`
and the RL steps' rollout/update split from `rl/metrics.jsonl`. The two runs must be alone on the machine: they
measure time. Writes `--out` (default bench/results/demo_stages.json).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import ROOT, machine, result_path, write_result

TIME_FIELDS = {
    "Elapsed (wall clock) time (h:mm:ss or m:ss)": "wall",
    "User time (seconds)": "user_s",
    "System time (seconds)": "system_s",
    "Maximum resident set size (kbytes)": "peak_rss_kb",
    "Minor (reclaiming a frame) page faults": "minor_faults",
}


def _wall_seconds(text: str) -> float:
    parts = [float(x) for x in text.split(":")]
    return sum(p * 60**i for i, p in enumerate(reversed(parts)))


def run_demo(src: Path, out: Path) -> dict:
    """One `tirl demo` (seed 0) from the package at `src`; its stages, pass@1, RL split and process totals."""
    env = {**os.environ, "PYTHONPATH": str(src), "TIRL_QUIET": "1"}
    cmd = [sys.executable, "-m", "tirl", "demo", f"out_dir={out}"]
    timer = shutil.which("time") or ("/usr/bin/time" if Path("/usr/bin/time").exists() else None)
    if timer:
        cmd = [timer, "-v", *cmd]
    t0 = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    if proc.returncode:
        raise SystemExit(f"tirl demo from {src} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    report = json.loads((out / "report.json").read_text())
    rl = [json.loads(line) for line in (out / "rl" / "metrics.jsonl").read_text().splitlines()]
    row = {
        "seconds": report["seconds"],
        "sft_pass@1": report["sft"]["pass@1"],
        "rl_pass@1": report["rl"]["pass@1"],
        "rl_sums": {k: sum(m.get(k, 0.0) for m in rl) for k in ("perf/step_s/rollout", "perf/step_s/update", "time/step")},
        "wall_s": round(time.time() - t0, 1),
    }  # fmt: skip
    for line in proc.stderr.splitlines():
        m = re.match(r"\s*(.+?):\s+(\S+)$", line)
        if m and m.group(1) in TIME_FIELDS:
            key, value = TIME_FIELDS[m.group(1)], m.group(2)
            row[key] = _wall_seconds(value) if key == "wall" else float(value)
    return row


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.demo_stages", description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, help="the git commit (or ref) to compare with")
    ap.add_argument("--out", default=str(result_path("demo_stages")))
    ap.add_argument("--machine", default="", help="the machine's name in docs/benchmarks.md")
    args = ap.parse_args(argv)

    ref = subprocess.run(
        ["git", "rev-parse", args.before], capture_output=True, text=True, cwd=ROOT, check=True
    )
    here = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT, check=True)
    result: dict = {
        "what": __doc__.splitlines()[0],
        "machine": machine(args.machine),  # before the runs: their load
        "before_commit": ref.stdout.strip(),
        "after": f"this checkout (HEAD {here.stdout.strip()[:7]} and its working tree)",
    }
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "before"
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), result["before_commit"]], cwd=ROOT,
                       check=True, capture_output=True)  # fmt: skip
        try:
            result["before_run"] = run_demo(tree / "src", Path(tmp) / "demo-before")
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, capture_output=True)
        result["after_run"] = run_demo(ROOT / "src", Path(tmp) / "demo-after")
    b, a = result["before_run"], result["after_run"]
    result["ratios_before_over_after"] = {
        "wall": b.get("wall", b["wall_s"]) / a.get("wall", a["wall_s"]),
        **{k: b["seconds"][k] / a["seconds"][k] for k in a["seconds"] if a["seconds"][k] > 0},
    }
    write_result(args.out, result)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
