"""Whether an RL run can start: every rule, in one module, each reading the engine's capability record
(`tirl.rollout.capabilities.EngineCapabilities`) and the RL settings, never the engine's name.

`check_rl` runs in the RL stage before any model loads; `tirl plan` runs `check_engine` (the same rules without
the machine's own checks: a plan is often made on another machine than the run).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tirl.rollout.capabilities import EngineCapabilities
from tirl.rollout.config import ENGINES, RolloutConfig
from tirl.rollout.factory import capabilities_for, preflight
from tirl.rollout.sampling import SamplingParams

if TYPE_CHECKING:
    from tirl.rollout.agent.config import ProgramConfig
    from tirl.train.rl.config import RLConfig


def sampling_of(ro: RolloutConfig) -> SamplingParams:
    """The sampling settings of `rollout.*` that RL samples with."""
    return SamplingParams(temperature=ro.temperature, top_p=ro.top_p, top_k=ro.top_k)


def check_rl(rl: RLConfig, ro: RolloutConfig, world: int, program: ProgramConfig | None = None) -> None:
    """Every rule on whether `tirl rl` can run `rl` with `rollout.engine` (and `agent.program`) on `world`
    processes, checked once, before any model loads (a ValueError naming the setting to change), and the engine's
    own checks of this machine."""
    caps = capabilities_for(ro.engine)
    check_engine(rl, caps, sampling_of(ro), world)
    if program is not None:
        check_program(rl, program)
    if rl.stream.enabled and caps.rollout_loop(ro.mode) != "async":
        raise ValueError(
            f"rl.stream.enabled with rollout.mode={ro.mode}: streaming runs each group through the async agent loop; "
            "use rollout.mode=async (or auto with a server engine)"
        )
    preflight(ro)


def check_program(rl: RLConfig, program: ProgramConfig) -> None:
    """An agent program's episodes of a step run inside one rollout call (the endpoint samples at one policy
    version): no streaming and no sampling ahead of the update."""
    if program.command and (rl.stream.enabled or rl.off_policy_steps):
        raise ValueError(
            "agent.program.command runs each step's episodes before its update: set rl.stream.enabled=false and "
            "rl.off_policy_steps=0"
        )


def check_engine(rl: RLConfig, caps: EngineCapabilities, sampling: SamplingParams, world: int) -> None:
    """The rules that read the engine's capabilities and the RL settings."""
    if why := rl_refusal(caps, world):
        raise ValueError(why)
    check_world(rl, world)
    check_rl_sampling(caps, sampling)
    check_lookahead(rl.off_policy_steps, caps)
    check_stream(rl, caps, world)


def rl_refusal(caps: EngineCapabilities, world: int) -> str | None:
    """Why RL cannot sample with this engine on `world` processes, naming the engines that can; None when it can."""
    why = why_not_rl(caps, world)
    if why is None:
        return None
    fit = " or ".join(n for n in ENGINES if why_not_rl(capabilities_for(n), world) is None)
    return f"{why}; use rollout.engine={fit} for tirl rl" + (" on several processes" if world > 1 else "")


def check_world(rl: RLConfig, world: int) -> None:
    """Under torchrun every rank takes an equal share of each step's prompts and of each mini-batch."""
    if world == 1:
        return
    if rl.prompts_per_step % world or rl.mini_batch_size % world:
        raise ValueError(
            f"rl.prompts_per_step={rl.prompts_per_step} and rl.mini_batch_size={rl.mini_batch_size} must both be "
            f"divisible by the number of processes ({world})"
        )
    if rl.dynamic_sampling:
        raise ValueError(
            "rl.dynamic_sampling is single-process only for now: ranks would keep different numbers of groups"
        )


def check_lookahead(off_policy_steps: int, caps: EngineCapabilities) -> None:
    """`rl.off_policy_steps` refused for an engine that samples from the trainer's own module."""
    if off_policy_steps and caps.shares_policy:
        raise ValueError(
            f"rl.off_policy_steps={off_policy_steps} with rollout.engine={caps.name}: it samples from the module the "
            "update changes while the update runs; use rollout.engine=vllm, or rl.off_policy_steps=0"
        )


def check_stream(rl: RLConfig, caps: EngineCapabilities, world: int) -> None:
    """`rl.stream.*`: an engine that can sample while the update runs (and interrupt requests, for partial
    rollouts), and a buffer that holds at least one step's groups on each rank."""
    s = rl.stream
    if not s.enabled:
        return
    if why := why_not_stream(caps, partial=s.partial):
        raise ValueError(why)
    local = rl.prompts_per_step // world
    if s.capacity(local) < local:
        raise ValueError(
            f"rl.stream.buffer_groups={s.buffer_groups} holds fewer groups than a step takes on each of the {world} "
            f"processes ({local} = rl.prompts_per_step / processes): the trainer would wait for ever; use at least "
            f"{local}, or 0 for (rl.stream.max_staleness + 1) x {local}"
        )


def why_not_rl(caps: EngineCapabilities, world: int) -> str | None:
    """Why RL cannot sample with this engine on `world` training processes; None when it can: it must receive the
    policy's new weights, and under torchrun work in several processes."""
    if not caps.receives_weights:
        return (
            f"rollout.engine={caps.name} cannot receive the policy's new weights, so RL would sample from a stale "
            "policy (use it for tirl eval)"
        )
    if world > 1 and not caps.multi_process:
        return (
            f"rollout.engine={caps.name} cannot run under torchrun (each of the {world} processes "
            "samples with an engine of its own, and this engine works in one process only)"
        )
    return None


def why_not_stream(caps: EngineCapabilities, *, partial: bool) -> str | None:
    """Why streaming RL (`rl.stream.enabled`; `partial`: `rl.stream.partial`) cannot sample with this engine: it
    samples while the update runs, so it needs weights of its own and a sync gate, and for partial rollouts
    requests it can interrupt."""
    if caps.shares_policy:
        return (
            f"rl.stream.enabled with rollout.engine={caps.name}: it samples from the module the update changes "
            "while the update runs; use rollout.engine=vllm (separate placement), or rl.stream.enabled=false"
        )
    if not caps.sync_gate:
        return (
            f"rl.stream.enabled with rollout.engine={caps.name}: its weight sync cannot wait for the requests in "
            "flight, so a turn could be sampled by two policies; use rollout.engine=vllm (separate placement)"
        )
    if partial and not caps.partial_rollouts:
        return (
            f"rl.stream.partial with rollout.engine={caps.name}: it cannot interrupt a request and continue "
            "from its tokens; use rollout.engine=vllm (separate placement), or rl.stream.partial=false"
        )
    return None


def check_rl_sampling(caps: EngineCapabilities, params: SamplingParams) -> None:
    """Refuse truncated sampling in RL when the log-probs are renormalized over the kept set: an engine that
    reports full-vocabulary log-probs (before top-k/top-p, what the trainer recomputes) may use it; vLLM's processed
    log-probs would add log(kept mass) to every importance ratio."""
    truncated = params.top_p < 1.0 or params.top_k > 0
    if truncated and caps.logprobs == "renormalized":
        raise ValueError(
            f"rollout.top_p={params.top_p}, top_k={params.top_k} with the {caps.name} engine: its log-probs are "
            "renormalized over the kept tokens, so every importance ratio is off by log(kept mass); use top_p "
            "1.0 and top_k -1 for RL with this engine (an engine with full-vocabulary log-probs, such as the "
            "torch engine, allows them)"
        )
