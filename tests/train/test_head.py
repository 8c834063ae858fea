"""The LM head with a recomputing backward (`tirl.train.head`) against plain autograd through the same products."""

import weakref

import pytest
import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

import tirl.train.head as head_mod
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
@pytest.mark.parametrize("w_rows", [8192, 64])  # the weight's gradient in one block, and in 5 of 301 rows
def test_float32_head_equals_plain_autograd(temperature, with_entropy, bias, w_rows, monkeypatch):
    monkeypatch.setattr(head_mod, "W_GRAD_ROWS", w_rows)
    torch.manual_seed(0)
    head = torch.nn.Linear(24, 301, bias=bias)
    rows, targets = torch.randn(37, 24), torch.randint(0, 301, (37,))
    g_logp, g_ent = torch.randn(37), torch.randn(37)
    ref = _grads(
        lambda r, h, t, **k: _plain(r, h, t, temperature, None, with_entropy),
        rows,
        head,
        targets,
        g_logp,
        g_ent,
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
    assert (
        saved and max(saved) <= 4096 * 16
    )  # the weight itself; a row of logits per token would be 64 * 4096


class _LiveBytes(TorchDispatchMode):
    """The most bytes held at once by tensors that ops create while the mode is on (freed ones leave)."""

    def __init__(self):
        super().__init__()
        self.live = self.peak = 0

    def _gone(self, n):
        self.live -= n

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in self._seen(args):
                n = t.untyped_storage().nbytes()
                self.live += n
                self.peak = max(self.peak, self.live)
                weakref.finalize(t.untyped_storage(), self._gone, n)
        return out

    @staticmethod
    def _seen(args):
        leaves = pytree.tree_leaves(args)
        return {a.untyped_storage().data_ptr() for a in leaves if isinstance(a, torch.Tensor)}


@pytest.mark.parametrize("dtype", [None, torch.bfloat16])
def test_backward_peak_holds_one_chunk_of_logits(dtype, monkeypatch):
    """The head's backward runs first, with every activation of the pass alive, so its peak is the pass's: the
    chunk's float32 logits are freed before the weight's gradient is formed, and that gradient's low-precision
    product exists a block of vocabulary rows at a time. Peak: one float32 (c, V) chunk (the probabilities are
    formed in place of the log-probs) and the float32 gradient of the weight, plus small change."""
    monkeypatch.setattr(head_mod, "W_GRAD_ROWS", 1024)
    torch.manual_seed(0)
    V, H, c = 4096, 16, 64
    head = torch.nn.Linear(H, V, bias=False)
    rows = torch.randn(c, H, requires_grad=True)
    logp, _ = head_logprobs(rows, head, torch.randint(0, V, (c,)), chunk_tokens=c, dtype=dtype)
    loss = logp.sum()
    with _LiveBytes() as mode:
        loss.backward()
    chunk, grad_w, block = c * V * 4, V * H * 4, 1024 * H * 4
    # bf16: the recomputed product's bf16 logits beside their float32 copy, half a chunk more
    bound = chunk * (3 if dtype else 2) // 2 + grad_w + block + c * H * 4 * 4
    assert mode.peak <= bound, (mode.peak, bound)


def _tied_grads(fn, ids, emb, head, targets, passes):
    """The tied weight's gradient after `passes` accumulated backward passes through the embedding and the head."""
    head.weight = emb.weight
    emb.zero_grad()
    for p in range(passes):
        rows = torch.tanh(emb(ids[p]))
        logp, _ = fn(rows, head, targets[p])
        logp.sum().backward()
    return emb.weight.grad.clone()


@pytest.mark.parametrize("dtype", [None, torch.bfloat16])
def test_tied_weight_gradient_added_in_place_equals_autograd(dtype, monkeypatch):
    """A tied head's weight gradient goes straight into `.grad` (no buffer waiting for the embedding's): the sum
    over the head's part, the embedding's part and two accumulated passes is plain autograd's."""
    torch.manual_seed(2)
    emb, head = torch.nn.Embedding(300, 24), torch.nn.Linear(24, 300, bias=False)
    ids, targets = torch.randint(0, 300, (2, 29)), torch.randint(0, 300, (2, 29))
    with torch.no_grad():  # as in a backward
        assert head_mod._grad_in_place(emb.weight)
    ref = _tied_grads(lambda r, h, t: _plain(r, h, t, 1.0, dtype, False), ids, emb, head, targets, 2)
    taken, real = [], head_mod._grad_in_place
    monkeypatch.setattr(head_mod, "_grad_in_place", lambda w: taken.append(real(w)) or taken[-1])
    got = _tied_grads(
        lambda r, h, t: head_logprobs(r, h, t, chunk_tokens=8, dtype=dtype), ids, emb, head, targets, 2
    )
    assert taken == [True, True]  # both passes added in place
    tol = {} if dtype is None else {"atol": 0.02 * float(ref.abs().max()), "rtol": 0.02}
    torch.testing.assert_close(got, ref, **tol)


def test_weight_with_a_hook_gets_its_gradient_through_autograd():
    """A hook on the weight (a distributed wrapper's, a user's) sees the head's whole gradient: no in-place add."""
    torch.manual_seed(3)
    head = torch.nn.Linear(16, 200, bias=False)
    rows, targets = torch.randn(12, 16), torch.randint(0, 200, (12,))
    seen = []
    head.weight.register_hook(lambda g: seen.append(g.clone()))
    with torch.no_grad():
        assert not head_mod._grad_in_place(head.weight)
    head_logprobs(rows, head, targets)[0].sum().backward()
    got = head.weight.grad.clone()
    plain = lambda r, h, t, **k: _plain(r, h, t, 1.0, None, False)  # noqa: E731
    ref = _grads(plain, rows, head, targets, torch.ones(12), None)
    torch.testing.assert_close(seen[0], ref[2][1])
    torch.testing.assert_close(got, ref[2][1])
