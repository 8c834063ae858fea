"""Where each of N GPUs goes in an RL run with vLLM (`tirl plan --gpus N`): the split between training processes
and vLLM servers, given or chosen, with its memory plan, weight sync and step time (`tirl.train.plan_step`).

With rollout.vllm.placement=separate and no --rollout-gpus, every split into whole servers is costed and the one
with the shortest synchronous step is chosen; the next ones are kept as runners-up. A split the config refuses (the
step's prompts or the mini-batch not dividing over the training ranks, a server straddling two nodes) or whose
training rank does not fit the GPU is left out with its reason, and an error lists them all when none is left. With
colocated every GPU trains and holds an engine (tensor parallel size 1, as `tirl.rollout.engines.vllm.colocated`).
Deliberately not here: the cost model (`tirl.train.plan_step`), the parser and the text (`tirl.commands.plan`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from tirl.rollout.engines.spec import BYTES, GIB, MemoryQuery
from tirl.rollout.engines.vllm.pool import sync_share
from tirl.train.plan import Plan, PlanError, load_arch, meta_model, plan
from tirl.train.plan_step import (
    Assumptions,
    StepTime,
    TrainShape,
    WeightSync,
    assumptions,
    rollout_seconds,
    step_time,
    sync_copy,
    trainer_seconds,
    weight_sync,
)

TP_SIZES = (1, 2, 4, 8)
RUNNERS_UP = 3


@dataclass
class Split:
    """Which GPUs train and which serve, and what one of each holds."""

    trainer_gpus: int
    rollout_gpus: int  # colocated: every GPU
    tp: int
    servers: int
    trainer_gib: float  # one training rank (tirl.train.plan)
    server_gib: float  # one server GPU: weights + KV cache; colocated: the awake engine
    fits: bool


@dataclass
class ClusterPlan:
    """The split, the weight sync and the step time of one run on `gpus` GPUs, and what they rest on."""

    gpus: int
    gpus_per_node: int
    gpu: str
    placement: str
    split: Split
    chosen_by: str
    runners_up: list[dict[str, float]]
    sync: WeightSync
    step: StepTime
    assumptions: Assumptions
    refused: dict[str, list[int]] = field(
        default_factory=dict
    )  # why -> the trainer GPU counts left out for it

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class _Run:
    """What every candidate split of one plan shares."""

    cfg: Any
    model: Any
    params: int
    gpus: int
    per_node: int
    gpu_gib: float
    arch: str
    a: Assumptions
    tp: int
    colocated: bool
    server_gib: float


@dataclass
class _Option:
    memory: Plan
    split: Split
    sync: WeightSync
    step: StepTime


def server_memory(cfg: Any, hf: Any, params: int, tp: int, gpu_gib: float) -> tuple[float, str]:
    """(GiB on each of its GPUs, why it cannot serve: "" when it can) of one vLLM server over `tp` GPUs: the vLLM
    memory estimate (`tirl.rollout.engines.vllm.spec.memory`) with weights and KV cache split over tp GPUs, and a
    KV cache that holds at least one full sequence."""
    from tirl.rollout.engines.vllm.colocated import engine_kwargs

    ro = cfg.rollout
    served = BYTES[ro.served_dtype(cfg.model.dtype)]
    seq = cfg.agent.max_prompt_tokens + cfg.agent.max_response_tokens
    weights = params * served / tp / GIB
    utilization = engine_kwargs(ro.vllm.args, 0).get("gpu_memory_utilization", 0.9)
    kv = ro.vllm.kv_cache_gib or utilization * gpu_gib - weights
    one = seq * MemoryQuery(ro, hf, params, cfg.model.dtype, 2, seq, 0, 1, gpu_gib, 0.0).kv_bytes_per_token(
        served
    )
    one = one / tp / GIB
    if weights + kv > gpu_gib:
        return (
            weights + kv,
            f"a tp-{tp} vLLM server: weights {weights:.2f} + KV cache {kv:.2f} GiB per GPU exceed {gpu_gib:g} GiB",
        )
    if kv < one:
        return weights + kv, (
            f"a tp-{tp} vLLM server: its weights ({weights:.2f} GiB per GPU) leave {kv:.2f} GiB of KV cache, less "
            f"than one {seq}-token sequence ({one:.2f} GiB)"
        )
    return weights + kv, ""


def default_tp(cfg: Any, hf: Any, params: int, gpu_gib: float, per_node: int) -> int:
    """The smallest tensor parallel size, within one node, whose server fits (`server_memory`)."""
    why = f"--gpus-per-node {per_node} holds no server"
    for tp in (t for t in TP_SIZES if t <= per_node and per_node % t == 0):
        why = server_memory(cfg, hf, params, tp, gpu_gib)[1]
        if not why:
            return tp
    raise PlanError(f"no tensor parallel size up to one node fits: {why}")


def _recomputes_old_logprobs(cfg: Any) -> bool:
    """Whether the trainer runs a forward for the old log-probs: the engine's own rule, for a synchronous step."""
    from tirl.rollout.factory import capabilities_for

    rl, caps = cfg.rl, capabilities_for(cfg.rollout.engine)
    on_policy = rl.ppo_epochs == 1 and rl.mini_batch_size >= rl.prompts_per_step * rl.n
    correction = caps.rollout_correction(rl.correction.mode)
    source = caps.old_logprobs(on_policy=on_policy, correction=correction, fresh=True, mode=rl.old_logprobs)
    return source == "recompute"


def sync_sends(trainers: int, servers: int, tp: int, per_node: int) -> list[tuple[int, int]]:
    """Each sending trainer node's (remote, local) vLLM workers, as the sync deals the servers out (`sync_share`,
    under torchrun's local world of min(trainers, per_node)): server j, on GPUs trainers + j x tp onwards, to one
    rank r, on node r // per_node; its tp workers are local when they share that node."""
    urls = [str(j) for j in range(servers)]
    sends: dict[int, list[int]] = {}
    for r in range(trainers):
        node = r // per_node
        for url in sync_share(urls, r, trainers, min(trainers, per_node)):
            counts = sends.setdefault(node, [0, 0])
            counts[(trainers + int(url) * tp) // per_node == node] += tp
    return [(remote, local) for _, (remote, local) in sorted(sends.items())]


def _refusal(run: _Run, trainers: int) -> str:
    """Why the config cannot train on `trainers` ranks with servers on the rest ("" when it can)."""
    rl = run.cfg.rl
    if rl.prompts_per_step % trainers or rl.mini_batch_size % trainers:
        return f"rl.prompts_per_step={rl.prompts_per_step} and rl.mini_batch_size={rl.mini_batch_size} do not divide over them"
    starts = range(trainers, run.gpus, run.tp)
    if not run.colocated and any(s // run.per_node != (s + run.tp - 1) // run.per_node for s in starts):
        return f"a tp-{run.tp} server would straddle two nodes"
    return ""


def _option(run: _Run, trainers: int) -> _Option | str:
    """The memory plan, sync and step time of `trainers` training GPUs, or why it cannot run."""
    if why := _refusal(run, trainers):
        return why
    try:
        memory = plan(run.cfg, processes=trainers, gpu_gib=run.gpu_gib, arch=run.arch)
    except PlanError as e:
        return str(e)
    cfg, a, N = run.cfg, run.a, run.gpus
    rollout_gpus = N if run.colocated else N - trainers
    servers = rollout_gpus // run.tp
    fits = memory.fits if run.colocated else memory.total_gib <= run.gpu_gib
    server_gib = memory.rollout_gib if run.colocated else run.server_gib
    split = Split(trainers, rollout_gpus, run.tp, servers, memory.total_gib, server_gib, fits)
    if not run.colocated:  # the memory plan's own engine line counts the rollout.urls servers, not this split
        where = (
            f"separate: {servers} vLLM server(s) of tp {run.tp} on GPUs {trainers}-{N - 1}, beside the {trainers} "
            f"training GPUs: {server_gib:.2f} GiB on each server GPU"
        )
        memory = dataclasses.replace(memory, fits=fits, rollout_gib=server_gib, rollout_engine=where)
    nodes = math.ceil(trainers / run.per_node)
    sends = [] if run.colocated else sync_sends(trainers, servers, run.tp, run.per_node)
    untie = not run.colocated and bool(getattr(run.model.config, "tie_word_embeddings", False))
    served = "" if run.colocated else cfg.rollout.served_dtype(cfg.model.dtype)
    copy = sync_copy(cfg, run.model, untie=untie, served=served)
    sync = weight_sync(copy, sends=sends, trainer_nodes=nodes, a=a, untied=untie)
    trajectories = cfg.rl.prompts_per_step * cfg.rl.n
    in_flight = (
        trajectories / N if run.colocated else min(trajectories, cfg.rollout.concurrency * trainers) / servers
    )
    shape = TrainShape(
        params=run.params, trainable=memory.trainable, trajectories=trajectories, trainer_gpus=trainers,
        trainer_nodes=nodes, epochs=cfg.rl.ppo_epochs, mini_batch=cfg.rl.mini_batch_size,
        micro_batch_tokens=memory.tokens_per_micro_batch, checkpointing=cfg.model.gradient_checkpointing,
        reshard=cfg.dist.reshard_after_forward, old_logprobs=_recomputes_old_logprobs(cfg),
        reference=cfg.rl.kl.coef > 0, weight_bytes=BYTES[cfg.model.dtype],
        grad_bytes=4 if cfg.model.lora.rank > 0 else BYTES[cfg.model.dtype],
    )  # fmt: skip
    step = step_time(
        rollout_seconds(a, trajectories, servers, in_flight),
        trainer_seconds(shape, a),
        sync.seconds[f"{a.link_gbps:g}"],
    )
    return _Option(memory, split, sync, step)


def _check_cluster(cfg: Any, gpus: int, per_node: int, rollout_gpus: int | None, tp: int | None) -> None:
    """The command line's cluster options against each other and the config."""
    if gpus < 1 or per_node < 1:
        raise PlanError(f"--gpus and --gpus-per-node must be >= 1, got {gpus} and {per_node}")
    if cfg.rollout.engine != "vllm":
        raise PlanError(
            f"--gpus sizes a run whose rollouts run on vLLM (rollout.engine=vllm), not rollout.engine={cfg.rollout.engine}"
        )
    if tp is not None and (tp not in TP_SIZES or tp > per_node or per_node % tp):
        raise PlanError(f"--vllm-tp {tp}: one of {TP_SIZES} that divides --gpus-per-node {per_node}")
    if cfg.rollout.vllm.placement == "colocated":
        if rollout_gpus is not None:
            raise PlanError(
                "--rollout-gpus with rollout.vllm.placement=colocated: every GPU trains and rolls out"
            )
        if tp not in (None, 1):
            raise PlanError(
                f"--vllm-tp {tp} with rollout.vllm.placement=colocated: each rank's engine runs on its own GPU"
            )
        return
    if gpus < 2:
        raise PlanError(
            "rollout.vllm.placement=separate needs --gpus 2 or more: one to train, one for a server"
        )
    if rollout_gpus is not None and not 1 <= rollout_gpus < gpus:
        raise PlanError(
            f"--rollout-gpus {rollout_gpus} must be between 1 and --gpus - 1 = {gpus - 1}: the rest train, and at "
            "least one GPU must"
        )


def _given_split(cfg: Any, gpus: int, rollout_gpus: int | None, tp: int) -> list[int]:
    """The trainer GPU counts to cost: the one given (colocated: all of them), or every split into whole servers."""
    if cfg.rollout.vllm.placement == "colocated":
        return [gpus]
    if rollout_gpus is None:
        return list(range(gpus - tp, 0, -tp))
    if rollout_gpus < tp or rollout_gpus % tp:
        raise PlanError(
            f"--rollout-gpus {rollout_gpus} is not a whole number of tp-{tp} vLLM servers (--vllm-tp)"
        )
    return [gpus - rollout_gpus]


def _setup(
    cfg: Any, gpus: int, per_node: int, tp: int | None, gpu_gib: float, arch: str, a: Assumptions
) -> _Run:
    """The model on the meta device and the servers' tensor parallel size and memory, shared by every split."""
    _, hf = load_arch(cfg.model.path, arch)
    model = meta_model(hf, cfg.model.lora if cfg.model.lora.rank > 0 else None)
    params = sum(p.numel() for n, p in model.named_parameters() if ".lora_" not in n)
    colocated = cfg.rollout.vllm.placement == "colocated"
    if colocated:
        return _Run(cfg, model, params, gpus, per_node, gpu_gib, arch, a, 1, True, 0.0)
    tp = tp or default_tp(cfg, hf, params, gpu_gib, per_node)
    server_gib, why = server_memory(cfg, hf, params, tp, gpu_gib)
    if why:
        raise PlanError(f"{why}: give a larger --vllm-tp")
    return _Run(cfg, model, params, gpus, per_node, gpu_gib, arch, a, tp, False, server_gib)


def cluster_plan(
    cfg: Any,
    *,
    gpus: int,
    gpus_per_node: int = 8,
    rollout_gpus: int | None = None,
    tp: int | None = None,
    gpu_gib: float = 80.0,
    arch: str = "",
    gpu: str = "h100",
    given: dict[str, float | None] | None = None,
) -> tuple[Plan, ClusterPlan]:
    """The memory plan of one training rank and the cluster plan of the run on `gpus` GPUs; raises PlanError when
    no split can run (the message lists each refused split with its reason)."""
    _check_cluster(cfg, gpus, gpus_per_node, rollout_gpus, tp)
    a = assumptions(cfg, gpu, **(given or {}))
    run = _setup(cfg, gpus, gpus_per_node, tp, gpu_gib, arch, a)
    colocated, tp = run.colocated, run.tp
    options, refused = [], {}
    for trainers in _given_split(cfg, gpus, rollout_gpus, tp):
        got = _option(run, trainers)
        if isinstance(got, str):
            refused.setdefault(got, []).append(trainers)
        else:
            options.append(got)
    searched = not colocated and rollout_gpus is None
    if searched:
        for o in [o for o in options if not o.split.fits]:
            refused.setdefault(f"a training rank needs more than --gpu-gib {gpu_gib:g}", []).append(
                o.split.trainer_gpus
            )
        options = sorted((o for o in options if o.split.fits), key=lambda o: o.step.total_s)
    if not options and not searched:
        why, trainers = next(iter(refused.items()))
        given_by = "placement colocated trains on" if colocated else f"--rollout-gpus {rollout_gpus} leaves"
        raise PlanError(f"{given_by} {trainers[0]} training GPUs, and {why}")
    if not options:
        reasons = "; ".join(f"{why} (training GPUs: {spans(ts)})" for why, ts in refused.items())
        raise PlanError(f"no split of {gpus} GPUs runs this config: {reasons}")
    best = options[0]
    chosen = (
        f"the shortest synchronous step at {a.link_gbps:g} Gb/s of {len(options)} that run" if searched
        else "placement colocated" if colocated else "given (--rollout-gpus)"
    )  # fmt: skip
    runners_up = [_summary(o) for o in options[1 : 1 + RUNNERS_UP]]
    return best.memory, ClusterPlan(
        gpus, gpus_per_node, gpu, cfg.rollout.vllm.placement, best.split, chosen, runners_up, best.sync, best.step,
        a, refused,
    )  # fmt: skip


def _summary(o: _Option) -> dict[str, float]:
    return {
        "trainer_gpus": o.split.trainer_gpus, "rollout_gpus": o.split.rollout_gpus, "servers": o.split.servers,
        "total_s": o.step.total_s, "overlapped_s": o.step.overlapped_s,
    }  # fmt: skip


def spans(counts: list[int]) -> str:
    """[7, 6, 5, 3, 1] -> "1, 3, 5-7": the refused trainer GPU counts, short."""
    out: list[str] = []
    for n in sorted(set(counts)):
        if out and out[-1].split("-")[-1] == str(n - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{n}"
        else:
            out.append(str(n))
    return ", ".join(out)
