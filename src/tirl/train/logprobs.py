"""Per-token log-probs and entropy of a causal LM on given ids: the trainer's view of what the engine sampled.

With `loss_mask`, only the positions that are trained are computed, through the LM head in chunks of
`chunk_tokens` rows (`tirl.train.head`: the backward recomputes each chunk's logits rather than keeping them): the
decoder's hidden states (B, T, H) are kept, but float32 logits exist for one chunk of (chunk_tokens, V) at a time
instead of the whole (B, T, V). For a 152k-token vocabulary and 16k-token responses the
full tensor alone would be ~10 GB per sequence. Models whose logits are not simply `lm_head(hidden)` (soft-capped
or scaled logits) and models whose own forward runs hooks (an FSDP-sharded model gathers its root's weights in
one) take the plain forward pass instead, so the numbers never depend on the path (under FSDP, bound the
(B, T, V) logits with micro_batch_tokens).

With `autocast` (e.g. torch.bfloat16, `model.autocast`), the decoder and the LM head run under `torch.autocast`
on the model's device type, while log-softmax and entropy are always computed in float32 on each chunk's logits:
a bf16 logsumexp over a large vocabulary would lose the small differences the PPO ratio is made of.

A right-padded batch (each row's tokens, then padding) whose wanted positions are all real (a loss mask that is 0
on padding, as the trainers' are) runs without its attention mask (`attention_mask_for`): under causal attention
a real position never reads the padding after it, so its numbers are the masked pass's to float rounding, while a
mask rules out the fused causal kernels (flash attention) and makes transformers expand grouped keys and values
to every head. Positions are 0..T-1 either way; only the padding's own states, which nothing reads, differ.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from tirl.algorithms import entropy_from_logits
from tirl.train.compiled import CompiledLayers, running
from tirl.train.head import head_logprobs
from tirl.train.prefix import full_attention_cache, plan_shared_prefixes, shared_prefix_hidden

DEFAULT_CHUNK_TOKENS = 1024


def _head_split(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module] | None:
    """(decoder, lm_head) when logits are exactly lm_head(decoder(...).last_hidden_state), else None."""
    if model._forward_pre_hooks or model._forward_hooks:  # calling decoder and head directly would skip them
        return None
    cfg = getattr(model, "config", None)
    if cfg is None or getattr(cfg, "final_logit_softcapping", None) or getattr(cfg, "logits_scaling", None):
        return None
    get_decoder, get_head = getattr(model, "get_decoder", None), getattr(model, "get_output_embeddings", None)
    if get_decoder is None or get_head is None:
        return None
    try:
        decoder, head = get_decoder(), get_head()
    except (AttributeError, NotImplementedError):
        return None
    return (decoder, head) if decoder is not None and isinstance(head, torch.nn.Linear) else None


def checkpointing(model: Any) -> bool:
    """Whether the model recomputes its layers in the backward (transformers renamed the flag in 5.x; it then keeps
    no key/value cache in training)."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model  # a PEFT model: its base's
    for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):
        if hasattr(type(inner), name) or name in vars(inner):
            return bool(getattr(inner, name))
    return False


def uses_fused_head(model: torch.nn.Module) -> bool:
    """`token_logprobs` takes the head of `tirl.train.head` for this model (else the model's own forward)."""
    return _head_split(model) is not None


def shares_prefixes(model: torch.nn.Module) -> bool:
    """`token_logprobs` can run rows that share a prompt through `tirl.train.prefix` for this model: the decoder
    and head apart (not FSDP-sharded), a key/value cache in training (no gradient checkpointing) that keeps every
    position."""
    config = getattr(model, "config", None)
    return uses_fused_head(model) and not checkpointing(model) and full_attention_cache(config)


def _logp_and_entropy(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """logits (N, V), targets (N,) -> log p(target) (N,) and entropy (N,) at `temperature`, in float32."""
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    lse = logits.logsumexp(dim=-1)  # (N,); no second (N, V) tensor as log_softmax would make
    logp = logits.gather(-1, targets[:, None]).squeeze(-1) - lse
    return logp, entropy_from_logits(logits) if with_entropy else None


def attention_mask_for(attention_mask: torch.Tensor, wanted: torch.Tensor) -> torch.Tensor | None:
    """None for a right-padded mask (no 0 before a 1 in any row) whose `wanted` (B, T) positions are all real
    (module docstring), else the mask as it is."""
    m = attention_mask.bool()
    return attention_mask if bool((m[:, 1:] & ~m[:, :-1]).any() | (wanted & ~m).any()) else None


def autocast_context(
    device: torch.device, dtype: torch.dtype | None
) -> contextlib.AbstractContextManager[object]:
    """torch.autocast on `device`'s type (cuda, cpu, ...) for `dtype`, or a no-op for None."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def backward_outside_autocast(loss: torch.Tensor) -> None:
    """`loss.backward()` with autocast off: the autograd engine runs the backward with the caller's autocast state,
    which would cast float32 backward products to bf16 inside a region kept open to cache the weights' casts."""
    with torch.autocast(device_type=loss.device.type, enabled=False):
        loss.backward()


def token_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    loss_mask: torch.Tensor | None = None,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    autocast: torch.dtype | None = None,
    prefix_len: torch.Tensor | None = None,
    compiled: CompiledLayers | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p(x_t | x_<t) for t >= 1, aligned with input_ids (B, T); position 0 gets 0.

    Sequences are right-padded, so positions are 0..T-1 and padding only follows real tokens. `temperature` scales
    the logits exactly as the engine does before sampling. Entropy (B, T) is returned when asked for. With
    `loss_mask` (B, T), only positions where it is non-zero are computed (the rest are 0), chunk by chunk.
    `autocast`: the lower-precision dtype of the forward pass (module docstring), None for full precision.
    `prefix_len` (B,): each row's prompt length; rows with the same prompt then share its pass
    (`tirl.train.prefix`). `compiled`: compiled layers on padded lengths, no shared prefixes (`tirl.train.compiled`).
    """
    B, T = input_ids.shape
    wanted = torch.ones_like(input_ids, dtype=torch.bool) if loss_mask is None else loss_mask.bool().clone()
    wanted[:, 0] = False  # nothing predicts the first token
    if compiled is not None:  # padding after every real token: the real positions' numbers stay
        input_ids, attention_mask, wanted = compiled.pad(input_ids, attention_mask, wanted)
    b_idx, t_idx = wanted.nonzero(as_tuple=True)  # (N,) each
    targets = input_ids[b_idx, t_idx]  # (N,)
    split = _head_split(model)
    amp = autocast_context(input_ids.device, autocast)
    mask = attention_mask_for(attention_mask, wanted)  # None for right padding: the fused causal kernels
    if split is not None:
        decoder, head = split
        plan = None
        if prefix_len is not None and shares_prefixes(model) and compiled is None:
            plan = plan_shared_prefixes(input_ids, prefix_len)
        with amp, running(compiled):  # rows (N, H): the state that predicted each wanted token
            if plan is not None:
                rows = shared_prefix_hidden(decoder, input_ids, attention_mask, plan, b_idx, t_idx - 1)
            else:
                hidden = decoder(input_ids=input_ids, attention_mask=mask, use_cache=False)
                rows = hidden.last_hidden_state[b_idx, t_idx - 1]
        pieces = [
            head_logprobs(
                rows, head, targets, temperature=temperature, chunk_tokens=chunk_tokens, dtype=autocast,
                with_entropy=with_entropy,
            )
        ]  # fmt: skip
    else:
        with amp, running(compiled):
            logits = model(input_ids=input_ids, attention_mask=mask).logits  # (B, T, V)
        pieces = [_logp_and_entropy(logits[b_idx, t_idx - 1], targets, temperature, with_entropy)]
    logp = torch.zeros(B, T, dtype=torch.float32, device=input_ids.device)
    ent = torch.zeros_like(logp) if with_entropy else None
    if b_idx.numel():  # index_put keeps the graph: gradients reach the model through the wanted positions
        logp = logp.index_put((b_idx, t_idx), torch.cat([p[0] for p in pieces]))
        if ent is not None:
            ent = ent.index_put((b_idx, t_idx), torch.cat([p[1] for p in pieces]))
    return logp, ent
