"""What an RL run trains with, as one typed record.

The stage builder (`tirl.commands.stages.run_rl`) calls `tirl.train.rl.check.check_rl` before any model loads, builds the model, the
engine and the agent, and hands them to `assemble`, which fits the prompts to the agent, sizes the micro-batches
for the model and wraps the KL reference. `RLTrainer` keeps the resulting `RLRun` (`trainer.run`) and builds nothing
of the run itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tirl.core.logging import MetricsLogger
from tirl.data.records import ProblemRow, problem_rows
from tirl.rewards.shaping import RewardConfig
from tirl.rollout.agent.episodes import check_prompt_lengths, model_positions
from tirl.rollout.agent.loop import AgentLoop
from tirl.rollout.capabilities import EngineCapabilities, capabilities_of
from tirl.rollout.sampling import SamplingParams
from tirl.train.manifest import RunIdentity
from tirl.train.memory import MicroBatchBudget, sized_micro_batches
from tirl.train.rl.batch import fitting_prompts
from tirl.train.rl.config import RLConfig
from tirl.train.rl.reference import Reference


@dataclass
class RLRun:
    """The RL trainer's inputs, checked and sized (`assemble` builds one)."""

    policy: torch.nn.Module
    tokenizer: Any
    agent: AgentLoop
    rows: list[ProblemRow]  # the prompts that fit agent.max_prompt_tokens
    cfg: RLConfig  # micro_batch_tokens resolved to a number
    micro_budget: MicroBatchBudget  # how micro-batches were sized, printed at start
    sampling: SamplingParams
    reward: RewardConfig
    out_dir: Path
    seed: int
    engine_caps: EngineCapabilities  # the engine's, with the run's precision
    logger: MetricsLogger | None = None
    autocast: torch.dtype | None = None  # model.autocast's dtype
    reference: Reference | None = None  # the KL reference (rl.kl.coef > 0)
    ref_source: str = ""  # where the reference (the initial policy) was loaded from
    identity: RunIdentity | None = None  # what checkpoints record, and a resume must match
    validate: Callable[[int], dict[str, float]] | None = None  # step -> validation metrics
    # model.compile_layers: the update's decoder layers compiled, lengths padded to this multiple; 0 = eager
    compile_pad_multiple: int = 0


def assemble(
    policy: torch.nn.Module,
    tokenizer: Any,
    agent: AgentLoop,
    rows: Sequence[dict[str, Any] | ProblemRow],
    cfg: RLConfig,
    *,
    sampling: SamplingParams,
    reward: RewardConfig,
    out_dir: str | Path,
    seed: int,
    autocast: torch.dtype | None = None,
    ref_dtype: torch.dtype | None = None,
    ref_model: torch.nn.Module | None = None,
    activation_gib: float = 0.0,
    logger: MetricsLogger | None = None,
    ref_source: str = "",
    identity: RunIdentity | None = None,
    validate: Callable[[int], dict[str, float]] | None = None,
    compile_pad_multiple: int = 0,
) -> RLRun:
    """The `RLRun` of these parts: prompts longer than agent.max_prompt_tokens dropped (verl's
    filter_overlong_prompts; an error if none is left or one runs past the model's positions), `micro_batch_tokens:
    auto` sized for `activation_gib` (tirl.train.memory), the KL reference wrapped when rl.kl.coef > 0 (`ref_model`:
    its copy when `policy` cannot be copied, being FSDP-sharded; else a frozen copy of `policy`, none for LoRA).
    `logger`, `ref_source`, `identity`, `validate` and `compile_pad_multiple` go to `RLRun` as they are."""
    if not rows:
        raise ValueError("RL needs at least one prompt row")
    fitted = fitting_prompts(problem_rows(rows), agent.renderer, agent.config.max_prompt_tokens)
    check_prompt_lengths(fitted, agent, model_positions(agent), what="rl.data")
    cfg, budget = sized_micro_batches(cfg, policy, autocast, activation_gib)
    reference = Reference(policy, ref_dtype, copy=ref_model) if cfg.kl.coef > 0 else None
    caps = capabilities_of(agent.engine).with_precision(None, autocast)  # bf16: not exact
    return RLRun(
        policy=policy,
        tokenizer=tokenizer,
        agent=agent,
        rows=fitted,
        cfg=cfg,
        micro_budget=budget,
        sampling=sampling,
        reward=reward,
        out_dir=Path(out_dir),
        seed=seed,
        engine_caps=caps,
        logger=logger,
        autocast=autocast,
        reference=reference,
        ref_source=ref_source,
        identity=identity,
        validate=validate,
        compile_pad_multiple=compile_pad_multiple,
    )
