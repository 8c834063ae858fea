"""Rollout wall time: the asynchronous agent loop against the lock-step loop on a long-tail workload, same run.

Workload: 32 trajectories of 3 turns (two tool calls, then an answer); slow tool calls take 1.0 s, the rest 0.05 s
(a sandbox stand-in that sleeps, so the 2-core machine's CPU is left to generation). Three workloads: no slow call;
the same 4 trajectories slow on both calls (both loops wait for them: no gain possible); 4 slow calls per turn on
different trajectories (lock-step waits 1 s every turn, async only once per slow trajectory).
Turns are scripted texts so that every loop runs the same trajectories; generation cost comes from the engine:
- `server`: a fake latency engine standing in for a vLLM/OpenAI server that batches concurrent requests itself:
  each `generate` call takes 0.15 s + 2 ms per prompt in it, whether it carries one prompt or many.
- `torch`: the tiny torch model really decodes 32 tokens per turn (TorchEngine, no EOS), then the scripted text is
  returned in their place: lock-step decodes all live trajectories in one batched forward per step, async one
  request per call from `concurrency` threads.
Writes bench/results/rollout_async.json, or `--out`.
"""

from __future__ import annotations

import threading
import time

import torch

from bench.common import cli as common_cli
from bench.common import tiny_model, tiny_tokenizer
from tirl.chat.template import ChatRenderer
from tirl.rollout.agent.async_loop import AsyncAgentLoop
from tirl.rollout.agent.loop import AgentConfig, AgentLoop
from tirl.rollout.capabilities import EngineCapabilities
from tirl.rollout.engines.base import RemoteModel
from tirl.rollout.engines.torch.engine import TorchEngine
from tirl.rollout.sampling import SamplingParams
from tirl.rollout.types import Generation
from tirl.sandbox.types import ExecResult
from tirl.tools.code_interpreter import tool_call_json

N, TAIL, SLOW_S, FAST_S = 32, 4, 1.0, 0.05


class Scripted(RemoteModel):
    """Two tool calls, then an answer; the code says how long its call takes. `cost(prompts)` is the generation."""

    capabilities = EngineCapabilities(
        name="scripted", weight_sync="none", logprobs="renormalized", per_request_seeds=True, multi_process=False,
        batches_requests=True,
    )  # fmt: skip

    def __init__(self, renderer, cost):
        self.r, self.cost, self.weight_version = renderer, cost, 0

    def generate(self, prompts, params, *, max_new_tokens=None, generator=None, seeds=None):
        self.cost(prompts)
        out = []
        for ctx in prompts:
            text = self.r.tokenizer.decode(ctx)
            if text.count("<tool_response>") >= 2:
                ids = self.r.encode("The answer is \\boxed{42}.") + [self.r.eos_id]
                out.append(Generation(ids, [-0.1] * len(ids), "eos"))
                continue
            k = text.count("<tool_response>")  # the call's turn; the question says which calls are slow
            code = "slow" if f"slow{k}" in text else "fast"
            ids = self.r.encode(f"Run it.\n<tool_call>\n{tool_call_json(code)}\n</tool_call>")
            out.append(Generation(ids, [-0.1] * len(ids), "stop"))
        return out


class SleepSandbox:
    def run_batch(self, codes, *, stdins=None, timeout_s=None):
        slowest = max((SLOW_S if "slow" in c else FAST_S for c in codes), default=0.0)
        time.sleep(slowest)  # a batch waits for its slowest call
        return [ExecResult("42\n", "", 0, False, False, 0.0) for _ in codes]


def server_cost(prompts):
    time.sleep(0.15 + 0.002 * len(prompts))


def torch_cost(model, tok):
    engine = TorchEngine(model, eos_ids=[10**9], pad_id=tok.pad_token_id)
    params = SamplingParams(max_new_tokens=32)
    lock = threading.Lock()
    gen = torch.Generator().manual_seed(0)

    def cost(prompts):
        with lock:  # one CPU generator; the forward passes themselves use torch's intra-op threads
            g = torch.Generator().manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=gen)))
        engine.generate([list(p) for p in prompts], params, generator=g)

    return cost


def timed(loop, prompts):
    t = time.perf_counter()
    trajs = loop.run(prompts, SamplingParams())
    assert all(x.stop_reason == "answer" and x.num_tool_calls == 2 for x in trajs)
    return time.perf_counter() - t


def main() -> dict:
    torch.set_num_threads(2)
    tok = tiny_tokenizer()
    renderer = ChatRenderer(tok)
    model = tiny_model(tok).eval()
    # which (trajectory, call) pairs are slow: none; the same TAIL trajectories on both calls; or TAIL calls per
    # turn spread over different trajectories (each slow at most once)
    workloads = {
        "no_tail": lambda i, k: False,
        "tail_fixed": lambda i, k: i < TAIL,
        "tail_spread": lambda i, k: i // TAIL == k and i < 2 * TAIL,
    }
    cfg = AgentConfig()
    results: dict = {
        "trajectories": N,
        "tail": TAIL,
        "tool_s": {"slow": SLOW_S, "fast": FAST_S},
    }
    for name, cost in (("server", server_cost), ("torch", torch_cost(model, tok))):
        eng = Scripted(renderer, cost)
        for wname, slow in workloads.items():
            prompts = [
                [
                    {
                        "role": "user",
                        "content": " ".join([f"q{i}:"] + [f"slow{k}" for k in (0, 1) if slow(i, k)]),
                    }
                ]
                for i in range(N)
            ]
            row = {"lockstep_s": timed(AgentLoop(eng, renderer, SleepSandbox(), cfg), prompts)}
            loop = AsyncAgentLoop(eng, renderer, SleepSandbox(), cfg, concurrency=32)
            row["async_c32_s"] = timed(loop, prompts)
            row["speedup_async"] = row["lockstep_s"] / row["async_c32_s"]
            results[f"{name}/{wname}"] = row
            print(name, wname, {k: round(v, 3) for k, v in row.items()})
    return results


def cli(argv: list[str] | None = None) -> None:
    common_cli("rollout_async", __doc__, lambda args: main(), argv, shown=None)


if __name__ == "__main__":
    cli()
