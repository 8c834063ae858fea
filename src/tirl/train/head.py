"""The LM head's log-probs (and entropy) of chosen tokens, with a backward that recomputes the logits.

Through plain autograd, each trained token keeps a float32 row of logits for the logsumexp's backward: vocab x 4
bytes a token (196 KB for SmolLM2's 49,152 words, 600 KB for Qwen's 151,936), more than the whole decoder's bf16
activations of a 576-wide model; and the backward then runs several vocab-wide passes over freshly allocated
(tokens, V) tensors. `head_logprobs` keeps only the logsumexp (and the entropy) per token: the backward recomputes
each chunk's logits with one more head product and forms the logits' gradient in place,

    d log p(t) / d z  = (onehot(t) - p) / T
    d H / d z         = -p (log p + H) / T

(z the logits, p = softmax(z / T), H the entropy), which is what liger-kernel's fused linear cross-entropy does
on GPUs, in plain PyTorch. The forward's numbers are the unfused path's (the same casts and reductions); the
weight's gradient sums the chunks in float32, formed a block of vocabulary rows at a time; each chunk's float32
logits are freed before it (the head's backward comes first, with every activation of the pass alive). Where it
can (`_grad_in_place`), the backward adds the weight's gradient into `weight.grad` itself and returns none for it.

`dtype` (bf16 under `model.autocast`): the head's product runs in it on bf16 copies of the weight and the rows, as
autocast would; log-softmax and entropy are float32.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

# The low-precision copies of head weights, by the weight's id, with its storage and version counter then: one
# cast serves the forward and backward of every micro-batch until an optimizer step changes the weight in place.
# An entry leaves with its weight (a weak reference's callback).
_CASTS: dict[int, tuple[weakref.ref, tuple[int, int], torch.Tensor]] = {}
W_GRAD_ROWS = 8192  # vocabulary rows of the weight's gradient formed at a time (`_add_weight_grad`)


def _cast(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    key, state = id(t), (t.data_ptr(), t._version)
    held = _CASTS.get(key)
    if held is None or held[0]() is not t or held[1] != state or held[2].dtype != dtype:
        ref = weakref.ref(t, lambda _, key=key: _CASTS.pop(key, None))
        held = (ref, state, t.detach().to(dtype))
        _CASTS[key] = held
    return held[2]


def _head_weights(
    weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    if dtype is None or dtype == weight.dtype:
        return weight, bias
    return _cast(weight, dtype), None if bias is None else _cast(bias, dtype)


def _scaled_logits(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, temperature: float
) -> torch.Tensor:
    """(c, V) float32 logits / T of rows `x` (c, H), in the weight's dtype."""
    z = torch.nn.functional.linear(x.to(weight.dtype), weight, bias).float()
    return z.div_(temperature) if temperature != 1.0 else z


def _entropy(logp: torch.Tensor) -> torch.Tensor:
    """(c,) entropy from (c, V) log-probs; -inf entries (a masked vocabulary) add 0."""
    p = logp.exp()
    return -(p * logp.masked_fill(p == 0, 0.0)).sum(dim=-1)


def _add_weight_grad(grad_w: torch.Tensor, gz: torch.Tensor, x: torch.Tensor) -> None:
    """grad_w (V, H) float32 += gz (c, V)^T x (c, H), W_GRAD_ROWS rows of the vocabulary at a time: the product
    in the compute dtype exists for one block, not for the whole (V, H) weight."""
    for v in range(0, grad_w.shape[0], W_GRAD_ROWS):
        grad_w[v : v + W_GRAD_ROWS].add_(gz[:, v : v + W_GRAD_ROWS].t() @ x)


def _grad_in_place(weight: torch.Tensor) -> bool:
    """Whether the backward may add the weight's gradient straight into `weight.grad` (as Megatron-LM's gradient
    accumulation fusion does) rather than return it: a float32 leaf with no hooks that would miss the addition,
    outside a double backward. A tied head (SmolLM2's, Qwen's small models') would otherwise hold its (V, H) float32
    gradient in autograd's buffer until the embedding's own arrives at the end of the backward: 108 MB of SmolLM2's
    peak."""
    grad = weight.grad
    return (
        type(weight) in (torch.Tensor, torch.nn.Parameter)
        and weight.is_leaf
        and weight.requires_grad
        and weight.dtype == torch.float32
        and not torch.is_grad_enabled()
        and not weight._backward_hooks
        and not getattr(weight, "_post_accumulate_grad_hooks", None)
        and (
            grad is None
            or (type(grad) is torch.Tensor and grad.dtype == torch.float32 and grad.is_contiguous())
        )
    )


class _HeadLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        rows: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        targets: torch.Tensor,
        temperature: float,
        chunk: int,
        dtype: torch.dtype | None,
        with_entropy: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        n = rows.shape[0]
        logp = torch.empty(n, dtype=torch.float32, device=rows.device)
        lse = torch.empty_like(logp)
        ent = torch.zeros_like(logp)
        with torch.autocast(rows.device.type, enabled=False), torch.no_grad():
            w, b = _head_weights(weight, bias, dtype)
            for s in range(0, n, chunk):
                z = _scaled_logits(rows[s : s + chunk], w, b, temperature)  # (c, V)
                lse[s : s + chunk] = z.logsumexp(dim=-1)
                logp[s : s + chunk] = (
                    z.gather(-1, targets[s : s + chunk, None]).squeeze(-1) - lse[s : s + chunk]
                )
                if with_entropy:
                    ent[s : s + chunk] = _entropy(z.sub_(lse[s : s + chunk, None]))
        ctx.save_for_backward(rows, weight, bias, targets, lse, ent)
        ctx.temperature, ctx.chunk, ctx.dtype, ctx.with_entropy = temperature, chunk, dtype, with_entropy
        return logp, ent

    @staticmethod
    def backward(ctx: Any, g_logp: torch.Tensor, g_ent: torch.Tensor) -> tuple[Any, ...]:
        rows, weight, bias, targets, lse, ent = ctx.saved_tensors
        T, chunk = ctx.temperature, ctx.chunk
        need_rows, need_w, need_b = ctx.needs_input_grad[:3]
        grad_rows = torch.empty_like(rows) if need_rows else None
        in_place = need_w and _grad_in_place(weight)
        if in_place and weight.grad is None:
            weight.grad = torch.zeros_like(weight)
        # float32 sums over the chunks: the weight's own .grad (in place), or made by the first chunk
        grad_w: torch.Tensor | None = weight.grad if in_place else None
        grad_b: torch.Tensor | None = None
        with torch.autocast(rows.device.type, enabled=False), torch.no_grad():
            w, b = _head_weights(weight, bias, ctx.dtype)
            for s in range(0, rows.shape[0], chunk):
                x = rows[s : s + chunk].to(w.dtype)
                logp = _scaled_logits(x, w, b, T).sub_(lse[s : s + chunk, None])  # (c, V) log-probs
                # p, in place of log p unless the entropy needs both
                gz = logp.exp() if ctx.with_entropy else logp.exp_()
                if ctx.with_entropy:  # - g_H p (log p + H)
                    coef = logp.masked_fill_(gz == 0, 0.0).add_(ent[s : s + chunk, None])
                    gz_ent = gz * coef.mul_(g_ent[s : s + chunk, None])
                gz.mul_(-g_logp[s : s + chunk, None])  # - g p ...
                gz.scatter_add_(
                    -1, targets[s : s + chunk, None], g_logp[s : s + chunk, None]
                )  # ... + g onehot
                if ctx.with_entropy:
                    gz.sub_(gz_ent)
                if T != 1.0:
                    gz.div_(T)
                if need_b:
                    grad_b = gz.sum(dim=0) if grad_b is None else grad_b.add_(gz.sum(dim=0))
                gzd = gz.to(w.dtype)  # (c, V)
                # the float32 (c, V) tensors go before the products allocate: the weight's gradient (V x H, float32)
                # is made while every activation of the pass is alive, so this is the backward's peak
                del logp, gz
                if ctx.with_entropy:
                    del coef, gz_ent
                if grad_rows is not None:
                    grad_rows[s : s + chunk] = (gzd @ w).to(rows.dtype)
                if need_w:
                    if grad_w is None:
                        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
                    _add_weight_grad(grad_w, gzd, x)
        if need_w and grad_w is None:  # no rows
            grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        if need_b and grad_b is None:
            grad_b = torch.zeros(bias.shape, dtype=torch.float32, device=bias.device)
        grad_w = None if grad_w is None or in_place else grad_w.to(weight.dtype)
        grad_b = None if grad_b is None else grad_b.to(bias.dtype)
        return grad_rows, grad_w, grad_b, None, None, None, None, None


def head_logprobs(
    rows: torch.Tensor,
    head: torch.nn.Linear,
    targets: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk_tokens: int = 1024,
    dtype: torch.dtype | None = None,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p(targets) (N,) float32 from hidden `rows` (N, H) through `head` at `temperature`, and the entropy (N,)
    when asked for; `chunk_tokens` rows of logits exist at a time, in the forward and in the backward."""
    logp, ent = _HeadLogprobs.apply(
        rows, head.weight, head.bias, targets, float(temperature), max(1, chunk_tokens), dtype, with_entropy
    )
    return logp, ent if with_entropy else None


__all__ = ["head_logprobs"]
