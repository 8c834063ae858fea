"""What a rollout engine can do, and the rollout's choices that depend on it, written once beside the capability
they read. Whether RL can start with an engine is `tirl.train.rl.check`'s, the one owner of those rules, which
reads these same records.

Each engine class carries an `EngineCapabilities` record as its `capabilities` attribute. The agent loops, the RL
trainer, the stages and `tirl plan` ask that record (through the methods below, or `tirl.rollout.factory` when they
only have the config's engine name), never the engine's class or name. The choices:

- `rollout.mode: auto` runs the async loop on engines that batch concurrent requests themselves (servers) and the
  lock-step loop otherwise (`rollout_loop`). For the in-process torch engine that is NOT a speed claim:
  bench/rollout_async.py measured the async loop faster on the tiny torch model too (2-core CPU shared with other
  jobs: 1.6-1.7x without slow tool calls, 2.2-4.8x with them), but lock-step keeps the demo's sampled trajectories
  and the exact-resume path (one generator for the batch) as they are; `rollout.mode: async` opts in.
- `rl.correction.mode: auto` is off (none) when the engine shares the policy module and computes in fp32 like
  the trainer, so its sampling log-probs are the trainer's own computation, and token_tis (cap 2.0) otherwise
  (another process, or bf16 on either side: `with_precision`): it keeps every sequence (no data dropped on
  small batches) and bounds each token's weight, verl's first fix for engine/trainer mismatch
  (`rollout_correction`). For the same reason only such an engine's log-probs serve as the update's old log-probs without a
  recomputation when a step takes several updates; a single on-policy update corrects in its own pass
  (`old_logprobs`).
- Seeds: an engine with per-request seeds gets one integer per request; one without gets a `torch.Generator`
  (`seed_kwargs`). A resumed run re-sends the weights to an engine that holds its own copy (`sync_on_resume`).
- What streaming RL (`rl.stream.*`) reads: whether the engine shares the policy module, whether its sync passes a
  gate that waits for the requests in flight (`sync_gate`), and whether it can interrupt a request and go on from
  the tokens sampled so far (`partial_rollouts`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

# How new policy weights reach the engine: "shared" it samples from the trainer's own module (nothing is copied),
# "disk" it reloads them from a directory the trainer writes, "memory" they are sent to it in memory, "none" it
# cannot receive them (evaluation only).
WEIGHT_SYNCS = ("shared", "disk", "memory", "none")
LOGPROBS = ("full", "renormalized")
MODES = ("lockstep", "async", "auto")


@dataclass(frozen=True)
class EngineCapabilities:
    """What one kind of engine can do; `name` is its `rollout.engine` value, used in messages."""

    name: str
    weight_sync: str  # one of WEIGHT_SYNCS
    logprobs: str  # "full": before top-k/top-p truncation; "renormalized": over the kept tokens after it
    per_request_seeds: bool  # `generate(seeds=[...])`, one per prompt; else one `generator` for the batch
    multi_process: bool  # works when each of several training processes (torchrun) has one
    batches_requests: bool  # batches concurrent `generate` calls itself (a server): the async loop's default
    # its log-probs are the trainer's own numbers: false when the engine decodes, or the trainer computes, in bf16
    same_numerics: bool = True
    # its sync waits for (or interrupts) the requests in flight (`tirl.rollout.engines.gate.RequestGate`)
    sync_gate: bool = False
    # it can interrupt a request at a sync, keep its tokens and continue from them with the new weights
    partial_rollouts: bool = False

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("EngineCapabilities needs the engine's name (its rollout.engine value)")
        if self.weight_sync not in WEIGHT_SYNCS:
            raise ValueError(
                f"{self.name}: weight_sync={self.weight_sync!r}; valid: {', '.join(WEIGHT_SYNCS)}"
            )
        if self.logprobs not in LOGPROBS:
            raise ValueError(f"{self.name}: logprobs={self.logprobs!r}; valid: {', '.join(LOGPROBS)}")

    @property
    def shares_policy(self) -> bool:
        """Samples from the trainer's own module in this process: a sync copies nothing, and its log-probs are the
        trainer's own computation, so there is no engine/trainer mismatch to measure or correct."""
        return self.weight_sync == "shared"

    @property
    def exact_logprobs(self) -> bool:
        """The sampling log-probs equal the trainer's to float rounding: nothing to recompute or correct."""
        return self.shares_policy and self.same_numerics

    def with_precision(self, engine_dtype: Any, trainer_dtype: Any) -> EngineCapabilities:
        """These capabilities for an engine decoding under `engine_dtype` autocast beside a trainer under
        `trainer_dtype` (None = fp32): bf16 on either side moves the log-probs by more than float rounding."""
        if engine_dtype is None and trainer_dtype is None:
            return self
        return replace(self, same_numerics=False)

    @property
    def receives_weights(self) -> bool:
        return self.weight_sync != "none"

    @property
    def sync_on_resume(self) -> bool:
        """A resumed run must send the checkpoint's weights: the engine still serves those it started with."""
        return self.receives_weights and not self.shares_policy

    def rollout_loop(self, mode: str) -> str:
        """ "lockstep" or "async" for `rollout.mode`."""
        if mode not in MODES:
            raise ValueError(f"unknown rollout.mode {mode!r}; valid: {', '.join(MODES)}")
        if mode == "auto":
            return "async" if self.batches_requests else "lockstep"
        return mode

    def rollout_correction(self, mode: str) -> str:
        """The correction `rl.correction.mode` names; "auto" resolved for this engine."""
        if mode == "auto":
            return "none" if self.exact_logprobs else "token_tis"
        return mode

    def old_logprobs(self, *, on_policy: bool, correction: str, fresh: bool, mode: str = "auto") -> str:
        """Where the update's old log-probs come from: "policy" (one update over the whole batch: the policy's own
        detached log-probs of that pass, nothing separate; a rollout correction, if any, is computed in that pass
        too), "engine" (several updates: the sampling log-probs, when they are the trainer's own to float rounding,
        nothing is corrected and the rollouts come from the weights the step starts with: `fresh`; the
        recomputation would repeat them, as verl's bypass mode says), or "recompute" (a no-grad pass of the policy
        before the first update, which also measures and corrects the engine/trainer mismatch). `mode` "recompute"
        (`rl.old_logprobs`) always recomputes."""
        if mode not in ("auto", "recompute"):
            raise ValueError(f"rl.old_logprobs={mode!r}; valid: auto, recompute")
        if mode == "recompute":
            return "recompute"
        if on_policy:
            return "policy"
        exact = self.exact_logprobs and correction == "none"
        return "engine" if exact and fresh else "recompute"

    def seed_kwargs(self, seed: int, device: Any = "cpu") -> dict[str, Any]:
        """`generate` keyword arguments that seed one request: a per-request seed, or a generator on `device`."""
        if self.per_request_seeds:
            return {"seeds": [seed]}
        return {"generator": torch.Generator(device).manual_seed(seed)}


def capabilities_of(engine: Any) -> EngineCapabilities:
    """`engine.capabilities`, or an error that says what an engine must declare."""
    try:
        caps = engine.capabilities
    except AttributeError:
        caps = None
    if not isinstance(caps, EngineCapabilities):
        raise TypeError(
            f"the rollout engine {type(engine).__name__} declares no `capabilities` (an EngineCapabilities from "
            "tirl.rollout.capabilities): add one as a class attribute so the trainer knows what it can do"
        )
    return caps
