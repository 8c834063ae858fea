"""The memory plan of a run (`tirl plan`): size a run before it starts, from the config and the model's
architecture, without its weights.

A 4B model that does not fit, or a config whose batch cannot be split over the processes, should fail here in a
second, not an hour into a run. The plan builds the model on PyTorch's `meta` device from its `config.json` (exact
parameter counts for any transformers architecture, no memory), applies LoRA the way training would, and estimates
the memory one process needs for the chosen options.

The estimate, per process (W processes; FSDP2 shards parameters, gradients and optimizer state W ways):
- weights: parameters x bytes of `model.dtype` / W, plus (W > 1) the unsharded working set FSDP2 gathers: the
  largest unit (one decoder layer, or the embedding) twice, for the prefetch, in the compute dtype;
- gradients and AdamW state: trainable parameters x (1 + 2) x bytes of the parameter dtype / W (torch's AdamW keeps
  its two moments in the parameter's dtype);
- reference model (KL on, full fine-tuning): parameters x bytes of `model.ref_dtype` / W; with LoRA the frozen base
  with the adapter disabled is the reference, so it costs nothing;
- activations of one micro-batch: what autograd keeps per token and decoder layer (norm inputs, q/k/v, attention
  output, the MLP's four intermediate tensors: 4h + 4-6 (q + kv) + 4I values, within 5% of what autograd saved
  on Qwen2/Qwen3 layers in tests/test_plan.py), or with gradient checkpointing
  the layer inputs plus one layer being recomputed; plus the log-prob head (`tirl.train.memory.head_bytes`): in
  one process the final hidden state of each trained token, which its backward recomputes the logits from, and
  one chunk's transient logits, softmax and gradient; sharded, one float32 row of logits per trained token, which
  autograd keeps for the backward, and one chunk's transient logits and gradient;
- a fixed reserve for the CUDA context and allocator fragmentation.
It is an estimate (±25% on activations); `bench/train.py` measures peak memory on the models this machine can run.

The rollout engine's memory (`rollout_gib`, `rollout_engine`, RL only) is the engine's own model
(`tirl.rollout.engines.<name>.spec.memory`): the torch engine's KV cache (or CUDA-graph arena and bf16 weight copy)
beside the trainer's resident state (sharded weights, gradients, AdamW state, reference, reserve); vLLM's weights
and KV cache on GPUs of their own (`separate`) or, asleep during the update, on each training GPU (`colocated`),
where the sum must fit too; nothing for servers someone else runs (openai).

`plan` reads the whole config tree (`TirlConfig`), typed loosely: train sits below the run config, which
imports it. Deliberately not here: the parser and the table `tirl plan` prints (`tirl.commands.plan`).
"""

from __future__ import annotations

import dataclasses
import json
import warnings
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from tirl.chat.template import format_mismatch
from tirl.core.errors import TirlError
from tirl.rollout.engines.spec import BYTES, GIB
from tirl.train.memory import activation_values_per_token, budget_bytes, head_bytes, tokens_for_budget

ARCH_DIR = "configs/arch"


class PlanError(TirlError):
    """The config cannot run as given (the message says why and what to change)."""


@dataclass
class Plan:
    """One process's memory estimate (GiB) and the facts it rests on."""

    stage: str
    arch: str
    processes: int
    params: int
    trainable: int
    tokens_per_micro_batch: int
    sequence_tokens: int
    weights_gib: float
    gathered_gib: float
    grads_gib: float
    optimizer_gib: float
    reference_gib: float
    activations_gib: float
    logits_gib: float
    reserve_gib: float
    total_gib: float
    gpu_gib: float
    fits: bool
    notes: list[str] = field(default_factory=list)
    rollout_gib: float = 0.0  # the rollout engine's memory during the rollouts (rl), by its own memory model
    rollout_engine: str = ""  # where the engine runs, what its memory is made of and the GPU split, in words
    tokens_source: str = ""  # where tokens_per_micro_batch comes from (auto: the trainer's budget rule)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def bundled_archs() -> list[str]:
    return sorted(
        p.name[: -len(".json")]
        for p in resources.files("tirl").joinpath(ARCH_DIR).iterdir()
        if p.name.endswith(".json")
    )


def _read_json(path: Path, what: str) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise PlanError(f"{what} {path}: not a JSON config.json ({e})") from None
    except RecursionError:
        raise PlanError(f"{what} {path}: not a config.json (nested too deeply to read)") from None
    if not isinstance(data, dict):
        raise PlanError(f"{what} {path}: not a JSON config.json (an object of settings)")
    return data


def _config_json(model_path: str) -> Path | None:
    """model.path's config.json: in the directory, or a Hub id's (fetched alone where allowed; a HubError says
    how to fetch it)."""
    from tirl.core.hub import HubError
    from tirl.models.hub import is_hub_id, resolve_model

    path = Path(model_path) / "config.json"
    if is_hub_id(model_path):
        try:
            path = resolve_model(model_path, files=("config.json",)).path / "config.json"
        except HubError as e:
            raise PlanError(f"{e}; or size it without the model: --arch with a config.json or one of: "
                            f"{', '.join(bundled_archs())}") from e  # fmt: skip
    return path if path.is_file() else None


def load_arch(model_path: str, arch: str = "") -> tuple[str, Any]:
    """(name, transformers config): `arch` (a bundled name or a config.json path) or `model_path`/config.json."""
    from transformers import AutoConfig

    if arch:
        if arch in bundled_archs():
            text = resources.files("tirl").joinpath(f"{ARCH_DIR}/{arch}.json").read_text(encoding="utf-8")
            data, name = json.loads(text), arch
        elif Path(arch).is_file():
            data, name = _read_json(Path(arch), "--arch"), str(arch)
        else:
            raise PlanError(
                f"--arch {arch!r} is neither a config.json file nor one of: {', '.join(bundled_archs())}"
            )
    elif model_path and (found := _config_json(model_path)) is not None:
        data, name = _read_json(found, "model.path"), model_path
    else:
        raise PlanError(
            f"model.path {model_path!r} has no config.json (the model is not downloaded yet?): pass --arch with "
            f"a config.json or one of: {', '.join(bundled_archs())}"
        )
    model_type = data.get("model_type")
    if not model_type:
        raise PlanError(f"{name}: config.json has no model_type")
    try:
        return name, AutoConfig.for_model(**data)
    except (ValueError, TypeError, RecursionError) as e:  # a setting of the wrong type, one nested too deeply
        raise PlanError(f"{name}: transformers cannot build model_type {model_type!r}: {e}") from e


def meta_model(hf_config: Any, lora: Any = None) -> Any:
    """The model on the meta device (shapes only), with LoRA applied as training would apply it."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = AutoModelForCausalLM.from_config(hf_config)
    if lora is not None and lora.rank > 0:
        from tirl.models.lora import apply_lora

        model = apply_lora(model, lora)
    return model


def _largest_unit(model: Any) -> int:
    """Parameters of the largest FSDP unit: one decoder layer, or the embedding / output head."""
    import torch

    layers = [
        m for m in model.modules() if type(m).__name__ in set(getattr(model, "_no_split_modules", None) or ())
    ]
    sizes = [sum(p.numel() for p in m.parameters()) for m in layers]
    sizes += [m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Embedding)]
    return max(sizes, default=0)


def _check(cfg: Any, stage: str, world: int, seq: int, hf_config: Any) -> list[str]:
    """Errors that would stop the run later; returns notes for things that run but deserve a look."""
    notes: list[str] = []
    max_pos = getattr(hf_config, "max_position_embeddings", None)
    if max_pos and seq > max_pos:
        raise PlanError(
            f"a sequence can reach {seq} tokens but the model's max_position_embeddings is {max_pos}"
        )
    if stage == "rl":
        rl = cfg.rl
        if rl.prompts_per_step % world:
            raise PlanError(
                f"rl.prompts_per_step={rl.prompts_per_step} must divide over {world} processes: each GRPO group "
                "stays whole on one rank"
            )
        batch = rl.prompts_per_step * rl.n
        if rl.mini_batch_size > batch:
            raise PlanError(
                f"rl.mini_batch_size={rl.mini_batch_size} exceeds the step's {batch} trajectories"
            )
        if batch % rl.mini_batch_size:
            notes.append(
                f"{batch} trajectories per step do not divide into mini-batches of {rl.mini_batch_size}"
            )
        if rl.mini_batch_size % world:
            raise PlanError(f"rl.mini_batch_size={rl.mini_batch_size} must divide over {world} processes")
        from tirl.rollout.factory import capabilities_for
        from tirl.train.rl.check import check_engine, sampling_of

        try:  # the RL stage's own rules (tirl.train.rl.check), without this machine's checks
            check_engine(rl, capabilities_for(cfg.rollout.engine), sampling_of(cfg.rollout), world)
        except ValueError as e:
            raise PlanError(str(e)) from None
        budget = rl.micro_batch_tokens
    else:
        if cfg.sft.batch_size % world:
            raise PlanError(f"sft.batch_size={cfg.sft.batch_size} must divide over {world} processes")
        budget = cfg.sft.micro_batch_tokens
    if budget != "auto" and budget and budget < seq:
        raise PlanError(
            f"{stage}.micro_batch_tokens={budget} is below one full sequence ({seq} tokens): a long sequence could "
            "not be placed in any micro-batch"
        )
    mismatch = format_mismatch(cfg.chat.format, model_type=getattr(hf_config, "model_type", ""))
    if mismatch:
        notes.append(mismatch)
    return notes


def _tokens_per_micro_batch(
    cfg: Any, stage: str, world: int, seq: int, hf_config: Any, compute_bytes: int, gpu_gib: float, model: Any
) -> tuple[int, str]:
    """(padded tokens of the largest micro-batch, where that bound comes from): `auto` is the trainer's own rule
    (`tirl.train.memory`), for model.device's kind, with `gpu_gib` as the GPU's memory."""
    from tirl.train.logprobs import DEFAULT_CHUNK_TOKENS

    section = cfg.rl if stage == "rl" else cfg.sft
    batch = cfg.rl.mini_batch_size if stage == "rl" else cfg.sft.batch_size
    whole = (section.micro_batch_size or batch // world) * seq  # no token bound: the rows at full length
    if section.micro_batch_tokens == "auto":
        kind = "cuda" if cfg.model.device.startswith("cuda") else "cpu"
        budget, why = budget_bytes(kind, activation_gib=cfg.model.activation_gib, device_gib=gpu_gib)
        cast = cfg.model.autocast_dtype(hf_config.hidden_size) is not None  # autocast's bf16 weight copies
        tokens = tokens_for_budget(
            hf_config, budget, checkpointing=cfg.model.gradient_checkpointing, compute_bytes=compute_bytes,
            chunk_tokens=DEFAULT_CHUNK_TOKENS, cast_params=sum(p.numel() for p in model.parameters()) if cast else 0,
            fused=world == 1,
        )  # fmt: skip
        return min(max(tokens, seq), whole), f"micro_batch_tokens=auto: {tokens:,} ({why})"
    if section.micro_batch_tokens:
        return section.micro_batch_tokens, "micro_batch_tokens"
    return whole, "no token bound: micro_batch_size (or the batch) at the longest length"


def plan(
    cfg: Any,
    *,
    stage: str = "rl",
    processes: int = 1,
    gpu_gib: float = 80.0,
    arch: str = "",
    reserve_gib: float = 1.5,
) -> Plan:
    """The memory estimate of `stage` (rl | sft) under `cfg` on `processes` processes; raises PlanError."""
    from tirl.train.logprobs import DEFAULT_CHUNK_TOKENS

    _check_inputs(stage, processes, gpu_gib)
    m = cfg.model
    name, hf_config = load_arch(m.path, arch)
    lora = m.lora if m.lora.rank > 0 else None
    model = meta_model(hf_config, lora)
    params = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    if lora is not None:
        params -= trainable  # the base model's count; the adapter is `trainable`
    seq = cfg.agent.max_prompt_tokens + cfg.agent.max_response_tokens if stage == "rl" else cfg.sft.max_length
    notes = _check(cfg, stage, processes, seq, hf_config)
    if stage == "rl" and not cfg.agent.max_prompt_tokens:
        notes.append("agent.max_prompt_tokens is 0 (no limit): sequences counted as the response budget only")
    W = processes
    compute_bytes = 2 if m.autocast_dtype(hf_config.hidden_size) is not None or BYTES[m.dtype] == 2 else 4
    state = _state_bytes(cfg, model, stage, params, trainable, W, compute_bytes)
    tokens, source = _tokens_per_micro_batch(cfg, stage, W, seq, hf_config, compute_bytes, gpu_gib, model)
    acts = tokens * activation_values_per_token(hf_config, m.gradient_checkpointing) * compute_bytes
    logits = head_bytes(tokens, hf_config, DEFAULT_CHUNK_TOKENS, fused=W == 1)  # sharded: the model's forward
    parts = [x / GIB for x in (*state, acts, logits)]
    total = sum(parts) + reserve_gib
    if not m.gradient_checkpointing and total > gpu_gib:
        notes.append("model.gradient_checkpointing=true keeps only each layer's input (see activations)")
    resident = sum(parts[:5]) + reserve_gib  # what stays on the GPU through the rollouts
    engine_gib, where, fits = _engine_memory(
        cfg, hf_config, params, seq, W, gpu_gib, resident, stage, compute_bytes
    )
    return Plan(
        stage=stage, arch=name, processes=W, params=params, trainable=trainable, tokens_per_micro_batch=tokens,
        tokens_source=source, sequence_tokens=seq, weights_gib=parts[0], gathered_gib=parts[1], grads_gib=parts[2],
        optimizer_gib=parts[3], reference_gib=parts[4], activations_gib=parts[5], logits_gib=parts[6],
        reserve_gib=reserve_gib, total_gib=total, gpu_gib=gpu_gib, fits=total <= gpu_gib and fits, notes=notes,
        rollout_gib=engine_gib, rollout_engine=where,
    )  # fmt: skip


def _check_inputs(stage: str, processes: int, gpu_gib: float) -> None:
    if stage not in ("rl", "sft"):
        raise PlanError(f"stage must be rl or sft, got {stage!r}")
    if processes < 1 or gpu_gib <= 0:
        raise PlanError(f"processes must be >= 1 and gpu memory > 0, got {processes}, {gpu_gib}")


def _state_bytes(
    cfg: Any, model: Any, stage: str, params: int, trainable: int, W: int, compute_bytes: int
) -> tuple[float, float, float, float, float]:
    """Bytes per process of (weights, gathered units, gradients, AdamW state, KL reference)."""
    m = cfg.model
    lora = m.lora.rank > 0
    p_bytes = BYTES[m.dtype]
    weights = params * p_bytes / W + (trainable * 4 / W if lora else 0)
    gathered = 2 * _largest_unit(model) * compute_bytes if W > 1 else 0
    train_bytes = 4 if lora else p_bytes  # the adapter trains in float32
    grads = trainable * train_bytes / W
    optimizer = 2 * trainable * train_bytes / W
    ref = 0.0
    if stage == "rl" and cfg.rl.kl.coef > 0 and not lora:
        ref = params * BYTES[m.ref_dtype or m.dtype] / W
    return weights, gathered, grads, optimizer, ref


def _engine_memory(
    cfg: Any,
    hf: Any,
    params: int,
    seq: int,
    world: int,
    gpu_gib: float,
    resident: float,
    stage: str,
    compute_bytes: int,
) -> tuple[float, str, bool]:
    """(the engine's GiB, where it runs and what that is made of, whether it fits): the engine's own memory model
    (`tirl.rollout.engines.<name>.spec`); nothing for SFT."""
    if stage != "rl":
        return 0.0, "", True
    from tirl.rollout.engines.spec import MemoryQuery
    from tirl.rollout.factory import engine_spec

    query = MemoryQuery(
        cfg.rollout, hf, params, cfg.model.dtype, compute_bytes, seq, cfg.rl.prompts_per_step * cfg.rl.n, world,
        gpu_gib, resident,
    )  # fmt: skip
    memory = engine_spec(cfg.rollout.engine).memory(query)
    return memory.gib, memory.where, memory.fits
