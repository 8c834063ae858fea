"""oneDNN's per-shape caches bounded (tirl's default) against PyTorch's 1,024 entries, in the SmolLM2 RL step.

Under bf16 autocast every micro-batch of a new token count made oneDNN keep about one more bf16 copy of a weight in
its caches (tirl/train/allocator.py). This runs `tirl rl` (bench/rl_step.py's shape and defaults: SmolLM2-135M,
8 prompts x 8 rollouts x 64 tokens, the torch engine, 2 threads) for STEPS steps twice, one fresh process each:
with tirl's bound, and with both caches set to 1,024 in the environment (a user's setting wins over tirl's), and
writes every step's rollout and update time and the process's peak RSS so far. The same seed gives both runs the
same prompts. Writes bench/results/onednn_caches.json, or `--out`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import SMOLLM2_DIR, machine, result_path, smollm2, write_result
from bench.rl_step import CONFIG, LIBRARY_DEFAULTS, SHAPES, tirl_shape
from tirl.train.allocator import ONEDNN_CACHE_VARS

STEPS = 4
UNBOUNDED = dict.fromkeys(ONEDNN_CACHE_VARS, "1024")
KEYS = ("time/rollout", "perf/step_s/update", "time/step", "perf/peak_rss_mb", "perf/tokens_per_s/rollout")


def run(model: str, name: str, env: dict[str, str], work: Path) -> dict:
    out = work / name
    shape = [o for o in tirl_shape(*SHAPES["full"]) if not o.startswith("rl.steps=")]
    cmd = [
        sys.executable, "-m", "tirl", "rl", "--config", str(CONFIG), "--out", str(out), f"model.path={model}",
        f"out_dir={out}", *LIBRARY_DEFAULTS, *shape, f"rl.steps={STEPS}",
    ]  # fmt: skip
    t0 = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "TIRL_QUIET": "1", **env})
    if proc.returncode:
        raise SystemExit(f"{name}: tirl rl failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {
        "caches": name, "env": env, "wall_s": round(time.time() - t0, 1),
        "steps": [{k: s.get(k) for k in KEYS} for s in steps],
    }  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.onednn_caches", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(SMOLLM2_DIR))
    ap.add_argument("--out", default=str(result_path("onednn_caches")))
    args = ap.parse_args(argv)
    smollm2(Path(args.model))
    for var in ONEDNN_CACHE_VARS:  # tirl's bound applies unless the environment sets the caches
        os.environ.pop(var, None)
    info = machine()
    with tempfile.TemporaryDirectory() as tmp:
        rows = [run(args.model, "tirl bound (64)", {}, Path(tmp))]
        rows.append(run(args.model, "PyTorch default (1,024)", UNBOUNDED, Path(tmp)))
    for r in rows:
        print(json.dumps(r), flush=True)
    mean = {
        r["caches"]: {k: sum(s[k] for s in r["steps"][1:]) / (STEPS - 1) for k in KEYS[:2]} for r in rows
    }  # steps 2 on: the first pays one-time work
    result = {
        "what": __doc__.splitlines()[0],
        "machine": info,
        "runs": rows,
        "mean_steps_2_on": mean,
        "peak_rss_mb_last_step": {r["caches"]: r["steps"][-1]["perf/peak_rss_mb"] for r in rows},
    }
    out = write_result(args.out, result)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
