"""vLLM inside the training processes (`rollout.vllm.placement: colocated`, GPU only): one engine per rank, asleep
while the policy updates.

As TRL's `vllm_mode="colocate"` and verl's hybrid engine: each torchrun rank builds `vllm.LLM(...,
distributed_executor_backend="external_launcher", enable_sleep_mode=True, tensor_parallel_size=1)` on its own GPU,
in torchrun's process group. The engine's life in a step, driven through `awake` (the trainer's rollouts) and
`sync_weights`:
- rollouts: `wake_up()` (weights back on the GPU, KV cache allocated), sample, then `sleep(level=1)` (weights
  offloaded to CPU memory, KV cache freed) so the update has the GPU;
- sync: `wake_up(tags=["weights"])` (no KV cache yet), the new weights loaded in place by the model's own
  `load_weights` over whole tensors (FSDP shards gathered one tensor at a time, every rank in the same order: no
  disk, no whole-model buffer), the prefix cache reset, and back to sleep.
Each rank samples its own prompt shard with its own engine; the lock-step agent loop drives it (`LLM.generate`
takes the whole batch).

Not tested on a GPU here: this machine has none. `tests/rollout/test_vllm_colocated.py` checks the control flow
with a fake backend; `VLLMBackend` is written against vLLM's documented `LLM` API (sleep mode, external launcher)
and imports vllm only when built, in the trainer's own environment. Refused at start-up without a GPU
(`tirl.rollout.engines.vllm.spec.preflight`), before any model is loaded.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Protocol

import torch

from tirl.rollout.capabilities import EngineCapabilities
from tirl.rollout.engines.base import RemoteModel
from tirl.rollout.engines.vllm.pool import rank
from tirl.rollout.engines.vllm.sync import full_tensors
from tirl.rollout.sampling import SamplingParams, per_prompt_budgets
from tirl.rollout.types import Generation


class Backend(Protocol):
    """What the colocated engine needs from vLLM's `LLM`; `VLLMBackend` is the real one."""

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        budgets: Sequence[int],
        seeds: Sequence[int],
    ) -> list[tuple[list[int], list[float], str]]: ...

    def sleep(self) -> None: ...

    def wake_up(self, tags: list[str] | None = None) -> None: ...

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None: ...

    def reset_prefix_cache(self) -> None: ...


def engine_kwargs(args: Sequence[str], kv_cache_gib: float) -> dict[str, Any]:
    """`rollout.vllm.args` (server flags, `--gpu-memory-utilization=0.75`) as `vllm.LLM` keyword arguments, and the
    KV cache size (`rollout.vllm.kv_cache_gib`; 0 leaves it to vLLM). A flag without `=value` is True."""
    out: dict[str, Any] = {}
    for arg in args:
        if not arg.startswith("--"):
            raise ValueError(
                f"rollout.vllm.args: {arg!r} is not a --flag or --flag=value (colocated passes them to LLM)"
            )
        key, _, raw = arg[2:].partition("=")
        value: Any = True if not raw else raw
        for cast in (int, float):
            try:
                value = cast(raw)
                break
            except ValueError:
                continue
        out[key.replace("-", "_")] = value
    if kv_cache_gib:
        out["kv_cache_memory_bytes"] = int(kv_cache_gib * 2**30)
    return out


class ColocatedEngine(RemoteModel):
    """One rank's sleeping vLLM engine (module docstring); implements `tirl.rollout.engines.base.Engine`."""

    capabilities = EngineCapabilities(
        name="vllm", weight_sync="memory", logprobs="renormalized", per_request_seeds=True, multi_process=True,
        batches_requests=False,
    )  # fmt: skip

    def __init__(self, backend: Backend, *, eos_ids: Sequence[int], stop_ids: Sequence[int] = ()) -> None:
        self.backend, self.eos_ids, self.stop_ids = backend, list(eos_ids), list(stop_ids)
        self.weight_version = 0
        self.state = "awake"  # awake | weights (weights on the GPU, no KV cache) | asleep
        self.sleep()

    def sleep(self) -> None:
        if self.state != "asleep":
            self.backend.sleep()
            self.state = "asleep"

    def wake(self) -> None:
        if self.state != "awake":
            self.backend.wake_up(None if self.state == "asleep" else ["kv_cache"])
            self.state = "awake"

    @contextmanager
    def awake(self) -> Iterator[None]:
        """Awake for the rollouts inside, asleep again after them (the update needs the memory)."""
        self.wake()
        try:
            yield
        finally:
            self.sleep()

    def check(self, tokenizer: Any) -> None:
        """The engine loads the tokenizer's own model directory: nothing to compare."""

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        *,
        max_new_tokens: Sequence[int] | int | None = None,
        generator: Any = None,
        seeds: Sequence[int] | None = None,
    ) -> list[Generation]:
        n = len(prompts)
        budgets = per_prompt_budgets(n, params, max_new_tokens)
        self.wake()  # evaluation between steps calls generate outside `awake`
        out = self.backend.generate(prompts, params, budgets, list(seeds) if seeds is not None else [0] * n)
        return [Generation(ids, lps, self._reason(ids, r), self.weight_version) for ids, lps, r in out]

    def _reason(self, ids: list[int], finish: str) -> str:
        if ids and ids[-1] in self.stop_ids:
            return "stop"
        return "length" if finish == "length" and not (ids and ids[-1] in self.eos_ids) else "eos"

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Load `model`'s weights in place (collective under FSDP: every rank gathers every tensor), then sleep."""
        if self.state == "asleep":
            self.backend.wake_up(["weights"])
            self.state = "weights"
        self.backend.load_weights(full_tensors(model))
        self.backend.reset_prefix_cache()
        self.weight_version += 1
        self.sleep()

    def close(self) -> None:
        self.backend = None  # type: ignore[assignment]


class VLLMBackend:
    """`vllm.LLM` in this process on this rank's GPU (external launcher, sleep mode); vllm imported here only."""

    def __init__(
        self, model: str, *, dtype: str, stop_ids: Sequence[int], extra: dict[str, Any] | None = None
    ) -> None:
        self.stop_ids = list(stop_ids)  # eos and turn-ending ids: a turn ends on any of them
        try:
            from vllm import LLM
        except ImportError as e:
            raise ValueError(
                "rollout.vllm.placement=colocated imports vLLM in the training processes: install vllm in the trainer's "
                f"environment (pip install vllm) or use rollout.vllm.placement=separate ({e})"
            ) from e
        self.llm = LLM(
            model=model, dtype=dtype, seed=rank(), tensor_parallel_size=1, enable_sleep_mode=True,
            distributed_executor_backend="external_launcher", logprobs_mode="processed_logprobs",
            generation_config="vllm", **(extra or {}),
        )  # fmt: skip

    def generate(self, prompts, params, budgets, seeds):  # noqa: ANN001, ANN201 - Backend's signature
        from vllm import SamplingParams as VSampling
        from vllm.inputs import TokensPrompt

        sps = [
            VSampling(
                temperature=params.temperature,
                top_p=params.top_p,
                top_k=params.top_k if params.top_k > 0 else -1,
                max_tokens=b,
                seed=s,
                logprobs=0,
                skip_special_tokens=False,
                stop_token_ids=self.stop_ids,
            )  # fmt: skip
            for b, s in zip(budgets, seeds, strict=True)
        ]
        outs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=list(p)) for p in prompts], sps, use_tqdm=False
        )
        result = []
        for o in outs:
            c = o.outputs[0]
            lps = [d[t].logprob for d, t in zip(c.logprobs, c.token_ids, strict=True)]
            result.append((list(c.token_ids), lps, c.finish_reason or "stop"))
        return result

    def sleep(self) -> None:
        self.llm.sleep(level=1)

    def wake_up(self, tags: list[str] | None = None) -> None:
        self.llm.wake_up(tags=tags)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        # the in-process worker's model (external launcher: no executor process in between), as TRL's colocate mode
        model = self.llm.llm_engine.model_executor.driver_worker.worker.model_runner.model
        device = next(model.parameters()).device
        model.load_weights((name, t.to(device)) for name, t in weights)

    def reset_prefix_cache(self) -> None:
        self.llm.reset_prefix_cache()
