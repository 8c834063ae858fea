"""The LM head with a recomputing backward (`tirl.train.head`) against plain autograd through the same products."""

import pytest
import torch

from tirl.algorithms import entropy_from_logits
from tirl.train.head import head_logprobs


def _plain(rows, head, targets, temperature, dtype, with_entropy):
    """The unfused path: logits kept for autograd, log-softmax and entropy in float32."""
    with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
        logits = head(rows)
    z = logits.float() / temperature
    logp = z.gather(-1, targets[:, None]).squeeze(-1) - z.logsumexp(dim=-1)
    return logp, entropy_from_logits(z) if with_entropy else None


def _grads(fn, rows, head, targets, g_logp, g_ent, **kw):
    rows = rows.clone().requires_grad_(True)
    head.zero_grad()
    logp, ent = fn(rows, head, targets, **kw)
    loss = (logp * g_logp).sum() + (0.0 if ent is None else (ent * g_ent).sum())
    loss.backward()
    grads = [rows.grad, head.weight.grad] + ([head.bias.grad] if head.bias is not None else [])
    return logp.detach(), None if ent is None else ent.detach(), [g.clone() for g in grads]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("with_entropy", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_float32_head_equals_plain_autograd(temperature, with_entropy, bias):
    torch.manual_seed(0)
    head = torch.nn.Linear(24, 301, bias=bias)
    rows, targets = torch.randn(37, 24), torch.randint(0, 301, (37,))
    g_logp, g_ent = torch.randn(37), torch.randn(37)
    ref = _grads(
        lambda r, h, t, **k: _plain(r, h, t, temperature, None, with_entropy), rows, head, targets, g_logp, g_ent
    )
    got = _grads(
        head_logprobs, rows, head, targets, g_logp, g_ent, temperature=temperature, chunk_tokens=10,
        with_entropy=with_entropy,
    )  # fmt: skip
    torch.testing.assert_close(got[0], ref[0])
    if with_entropy:
        torch.testing.assert_close(got[1], ref[1])
    else:
        assert got[1] is None
    for a, b in zip(got[2], ref[2], strict=True):
        torch.testing.assert_close(a, b)


def test_bf16_head_gives_autocast_numbers():
    """Under bf16 the forward is autocast's to the bit (one chunk); the gradients agree to bf16 rounding, the
    weight's summed over chunks in float32 (autocast's path sums them in bf16)."""
    torch.manual_seed(1)
    head = torch.nn.Linear(64, 500, bias=False)
    rows, targets = torch.randn(40, 64), torch.randint(0, 500, (40,))
    g = torch.randn(40)
    ref = _grads(lambda r, h, t, **k: _plain(r, h, t, 1.0, torch.bfloat16, False), rows, head, targets, g, g)
    one = _grads(head_logprobs, rows, head, targets, g, g, chunk_tokens=64, dtype=torch.bfloat16)
    assert torch.equal(one[0], ref[0])
    chunked = _grads(head_logprobs, rows, head, targets, g, g, chunk_tokens=8, dtype=torch.bfloat16)
    for got in (one, chunked):
        for a, b in zip(got[2], ref[2], strict=True):
            torch.testing.assert_close(a, b, atol=0.02 * float(b.abs().max()), rtol=0.02)


def test_keeps_no_vocabulary_wide_tensor_for_the_backward():
    """What autograd saves between the forward and the backward: the rows, the weight and per-token scalars, never
    a (tokens, V) tensor."""
    head = torch.nn.Linear(16, 4096, bias=False)
    rows = torch.randn(64, 16, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        head_logprobs(rows, head, torch.randint(0, 4096, (64,)), chunk_tokens=16)
    assert saved and max(saved) <= 4096 * 16  # the weight itself; a row of logits per token would be 64 * 4096
