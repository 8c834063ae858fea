"""Which agent loop and which rollout correction an engine gets, and the top-p/top-k rule for RL.

- `rollout.mode: auto` runs the async loop on server engines, which batch concurrent requests themselves, and
  the lock-step loop on the in-process torch engine. That last choice is NOT a speed claim: bench/rollout_async.py
  measured the async loop faster on the tiny torch model too (2-core CPU shared with other jobs: 1.6-1.7x without
  slow tool calls, 2.2-4.8x with them), but lock-step keeps the demo's sampled trajectories, the README's demo numbers and the exact-resume
  path (one generator for the batch) as they were; `rollout.mode: async` opts in.
- `rl.rollout_correction: auto` is off (none) for the torch engine, whose sampling log-probs are the trainer's own
  computation on the same module, and token_tis (cap 2.0) otherwise: it keeps every sequence (no data dropped on
  small batches) and bounds each token's weight, verl's first fix for engine/trainer mismatch.
- Truncated sampling: the torch engine reports log-probs before top-k/top-p (full vocabulary, what the trainer
  recomputes), so it may use them in RL. A server engine (vLLM processed logprobs) renormalizes over the kept set,
  which adds log(kept mass) to every ratio: RL refuses top_p < 1 or top_k > 0 with it rather than train on biased
  ratios.
"""

from __future__ import annotations

from typing import Any

from tirl.rollout.engine import TorchEngine
from tirl.rollout.sampling import SamplingParams

MODES = ("lockstep", "async", "auto")


def is_in_process(engine: Any) -> bool:
    return isinstance(engine, TorchEngine)


def resolve_mode(mode: str, engine: Any) -> str:
    if mode not in MODES:
        raise ValueError(f"unknown rollout.mode {mode!r}; valid: {', '.join(MODES)}")
    if mode == "auto":
        return "lockstep" if is_in_process(engine) else "async"
    return mode


def resolve_correction(mode: str, engine: Any) -> str:
    if mode == "auto":
        return "none" if is_in_process(engine) else "token_tis"
    return mode


def check_rl_sampling(engine: Any, params: SamplingParams) -> None:
    """Refuse truncated sampling in RL with an engine whose log-probs are renormalized over the kept set."""
    truncated = params.top_p < 1.0 or params.top_k > 0
    if truncated and not is_in_process(engine):
        raise ValueError(
            f"rollout.top_p={params.top_p}, top_k={params.top_k} with the {type(engine).__name__} engine: its "
            "log-probs are renormalized over the kept tokens, so every importance ratio is off by log(kept mass); "
            "use top_p 1.0 and top_k -1 for RL with this engine (the torch engine reports full-vocabulary log-probs "
            "and allows them)"
        )
