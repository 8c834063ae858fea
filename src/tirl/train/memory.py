"""How many padded tokens one forward/backward may take, from a memory budget: `micro_batch_tokens: auto`.

Without a bound, a mini-batch goes through one forward/backward and its activations scale with it: the RL step of
a 135M-parameter model (SmolLM2, 64 trajectories of about 170 tokens) peaked at 19 GB (`bench/rl_step.py`). `auto` (the default of `rl` and `sft`)
splits each mini-batch into micro-batches whose activations fit a budget; gradients accumulate, so the update is
the mini-batch's to float rounding (`tirl.train.rl.update`).

The budget (`model.activation_gib`, 0 = by the device):
- CPU: 1 GiB, or a quarter of the machine's memory (MemTotal, and the cgroup's limit where one is set) when that
  is less. On a CPU a larger pass buys little: SmolLM2's forward/backward ran at 125 tokens/s with 424 tokens per
  pass, 135 with 848, 144 from 1,696 on (fp32, 2 cores), at 2-7x the memory. Not the memory free at start-up: that
  moves with the machine's load, and the split into micro-batches changes the update's float sums, so two runs of
  one command (or a run and its resumption) would train differently.
- CUDA: a quarter of the device's memory (the weights, gradients, optimizer state and a colocated engine share
  the rest; `tirl plan` shows the split).
Tokens per micro-batch: the most whose peak fits the budget (`tokens_for_budget`): what autograd keeps per token
(the decoder's activations, `activation_values_per_token`, within 5% of what autograd saves, tests/test_plan.py;
plus the hidden state the chunked head keeps for the backward, which recomputes the logits,
tests/train/test_memory.py) times PEAK_FACTOR for the backward's transients, plus one chunk of logits and their
gradient, plus the bf16 copies autocast makes of the weights.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tirl.train.logprobs import checkpointing, uses_fused_head

GIB = 1024**3
CPU_BUDGET_GIB = 1.0
GPU_SHARE = 0.25
MIN_TOKENS = 256  # a floor so that a tiny budget still makes progress
# Peak memory of a forward/backward over what autograd keeps: each layer's activation gradients, the head's
# gradients and allocator slack come on top in the backward (1.9-2.1x measured as peak RSS on SmolLM2-135M, fp32,
# 424 to 3,392 tokens per pass)
PEAK_FACTOR = 2.0


def activation_values_per_token(hf_config: Any, checkpointing: bool) -> int:
    """Values autograd keeps per token for the whole decoder stack (two norms, q/k/v through rotary and attention,
    the SwiGLU MLP's four tensors; with gradient checkpointing only each layer's input plus one layer)."""
    h = hf_config.hidden_size
    heads = hf_config.num_attention_heads
    head_dim = getattr(hf_config, "head_dim", None) or h // heads
    q = heads * head_dim
    kv = (getattr(hf_config, "num_key_value_heads", None) or heads) * head_dim
    inter = hf_config.intermediate_size
    qk_norm = 1 if getattr(hf_config, "model_type", "").startswith("qwen3") else 0
    # two RMSNorms (input, output) 4h; q and k through rotary (projection, rotate_half, rotated) and attention's
    # saved q/k/v/output 4(q + kv), two more with Qwen3's q/k norms; the SwiGLU MLP's gate, up, act, product 4I
    per_layer = 4 * h + (4 + 2 * qk_norm) * (q + kv) + 4 * inter
    layers = hf_config.num_hidden_layers
    kept = layers * h + per_layer if checkpointing else layers * per_layer
    return kept + h  # + the final hidden states the chunked head reads


def _meminfo_total() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _cgroup_limit() -> int | None:
    """The cgroup's (v2, else v1) memory limit, or None without one. Its limit, not its room: what the cgroup's
    other processes use at this moment is load, and must not decide the micro-batches (module docstring)."""
    for limit in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            cap = Path(limit).read_text().strip()
        except OSError:
            continue
        if cap != "max" and cap.isdigit() and int(cap) < 1 << 60:  # v1 reports "no limit" as a huge number
            return int(cap)
    return None


def cpu_memory_bytes() -> int | None:
    """The machine's memory as this process may use it: MemTotal, bounded by the cgroup's limit; None if
    unreadable. Fixed for a machine, unlike the memory free at a given moment."""
    known = [x for x in (_meminfo_total(), _cgroup_limit()) if x is not None]
    return min(known) if known else None


@dataclass(frozen=True)
class MicroBatchBudget:
    """The resolved token budget of a micro-batch and where it came from (printed at start-up, in `tirl plan`)."""

    tokens: int  # padded tokens per forward/backward; 0 = no bound (the whole mini-batch)
    budget_gib: float = 0.0  # the activation memory it was sized for (auto), else 0
    source: str = ""  # in words

    def describe(self) -> str:
        if not self.tokens:
            return "micro-batches: no token bound (micro_batch_tokens=0)"
        return f"micro-batches: at most {self.tokens:,} padded tokens ({self.source})"


def budget_bytes(
    device_type: str, *, activation_gib: float = 0.0, device_gib: float = 0.0
) -> tuple[int, str]:
    """(bytes, why) of the activation budget; `device_gib`: the GPU's memory (0 = read it from CUDA)."""
    if activation_gib > 0:
        return int(activation_gib * GIB), f"model.activation_gib={activation_gib:g}"
    if device_type == "cuda":
        if not device_gib:
            import torch

            device_gib = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory / GIB
        return int(GPU_SHARE * device_gib * GIB), f"auto: a quarter of the GPU's {device_gib:.0f} GiB"
    cap = int(CPU_BUDGET_GIB * GIB)
    total = cpu_memory_bytes()
    if total is not None and total // 4 < cap:
        return total // 4, f"auto: a quarter of the machine's {total / GIB:.1f} GiB"
    return cap, f"auto: {CPU_BUDGET_GIB:g} GiB of activations on a CPU"


HEAD_ROW_BYTES = (
    40  # per trained token beyond its hidden row: target, logsumexp, entropy and the gather's indices
)
# float32 (chunk, V) tensors alive at once in the head's backward (tirl.train.head): 3 with the entropy (log-probs,
# probabilities, the entropy's term), 1.5 without (the probabilities and their bf16 copy)
HEAD_TRANSIENT = 3


def head_bytes(tokens: int, hf_config: Any, chunk_tokens: int, *, fused: bool = True) -> int:
    """The log-prob head's memory for `tokens` trained tokens. `fused` (`tirl.train.head`, one process): autograd
    keeps each token's float32 hidden row and a few numbers (HEAD_ROW_BYTES), no row of logits; one chunk of
    `chunk_tokens` rows of logits exists at a time (in the backward: the recomputed logits, their softmax and its
    low-precision copy). Not fused (an FSDP-sharded model takes the model's own forward): a float32 row of logits
    and the hidden state per token, plus one chunk's logits and gradient."""
    vocab, hidden = hf_config.vocab_size, hf_config.hidden_size
    if not fused:
        return tokens * (vocab + hidden) * 4 + 2 * min(tokens, chunk_tokens) * vocab * 4
    return tokens * (hidden * 4 + HEAD_ROW_BYTES) + HEAD_TRANSIENT * min(tokens, chunk_tokens) * vocab * 4


def tokens_for_budget(
    hf_config: Any,
    budget: int,
    *,
    checkpointing: bool,
    compute_bytes: int,
    chunk_tokens: int,
    cast_params: int = 0,
    fused: bool = True,
) -> int:
    """Padded tokens whose peak memory in a forward/backward fits `budget` bytes, at least MIN_TOKENS.

    Peak = PEAK_FACTOR x what autograd keeps (decoder activations and the head's rows, per token) + one chunk's
    transient logits and gradient + the autocast copies of `cast_params` parameters (2 bytes each). `fused`:
    the head of `head_bytes`."""
    head = head_bytes(1, hf_config, 0, fused=fused)
    kept = activation_values_per_token(hf_config, checkpointing) * compute_bytes + head
    per_token = PEAK_FACTOR * kept
    transient = head_bytes(1, hf_config, 1, fused=fused) - head  # per token of the first chunk
    room = budget - 2 * cast_params
    tokens = room / (per_token + transient)
    if tokens > chunk_tokens:  # the transient stops growing at one chunk
        tokens = (room - transient * chunk_tokens) / per_token
    return max(MIN_TOKENS, int(tokens))


def resolve_micro_batch_tokens(
    setting: int | str,
    model: Any,
    *,
    autocast: Any = None,
    activation_gib: float = 0.0,
    chunk_tokens: int = 1024,
) -> MicroBatchBudget:
    """`micro_batch_tokens` as the trainer uses it: a number as given (0 = no bound), `auto` sized for the policy
    `model` on its device (module docstring)."""
    if setting != "auto":
        return MicroBatchBudget(int(setting), source="micro_batch_tokens")
    param = next(model.parameters())
    budget, why = budget_bytes(param.device.type, activation_gib=activation_gib)
    tokens = tokens_for_budget(
        model.config,
        budget,
        checkpointing=checkpointing(model),
        compute_bytes=2 if autocast is not None else param.element_size(),
        chunk_tokens=chunk_tokens,
        cast_params=sum(p.numel() for p in model.parameters()) if autocast is not None else 0,
        fused=uses_fused_head(model),
    )
    return MicroBatchBudget(tokens, budget / GIB, why)


def sized_micro_batches(
    section: Any, model: Any, autocast: Any = None, activation_gib: float = 0.0
) -> tuple[Any, MicroBatchBudget]:
    """A trainer's config section (`RLConfig`, `SFTConfig`) with `micro_batch_tokens` resolved for `model`, and
    the budget (to print)."""
    budget = resolve_micro_batch_tokens(
        section.micro_batch_tokens, model, autocast=autocast, activation_gib=activation_gib
    )
    return dataclasses.replace(section, micro_batch_tokens=budget.tokens), budget


__all__ = [
    "MicroBatchBudget",
    "activation_values_per_token",
    "budget_bytes",
    "cpu_memory_bytes",
    "head_bytes",
    "resolve_micro_batch_tokens",
    "sized_micro_batches",
    "tokens_for_budget",
]
