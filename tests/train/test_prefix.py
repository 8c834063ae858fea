"""Rows sharing a prompt run it once (`tirl.train.prefix`): the same log-probs and gradients as the plain forward."""

import random
from types import SimpleNamespace

import pytest
import torch

from conftest import make_model
from tirl.algorithms import get_policy_loss
from tirl.core.padding import shared_prefix_parts
from tirl.train.batch import collate
from tirl.train.logprobs import shares_prefixes, token_logprobs
from tirl.train.prefix import _expand, _rows, plan_shared_prefixes
from tirl.train.rl.update import LossSpec, accumulate_gradients


def _batch(vocab: int, seed: int = 0):
    """Two prompts with three responses each and one prompt with one, right-padded; loss on the responses."""
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, vocab, (n,), generator=g).tolist() for n in (5, 9, 7)]
    rows, masks, plen = [], [], []
    for p, lens in zip(prompts, ((4, 11, 1), (6, 2, 8), (5,)), strict=True):
        for n in lens:
            rows.append(p + torch.randint(3, vocab, (n,), generator=g).tolist())
            masks.append([0] * len(p) + [1] * n)
            plen.append(len(p))
    batch = collate(
        rows, masks, pad_id=0, extra={"advantages": [[float(len(r) % 3 - 1)] * len(r) for r in rows]}
    )
    batch.prefix_len = torch.tensor(plen)
    return batch


def test_plan_groups_identical_prompts_only():
    ids = torch.tensor([[1, 2, 3, 9], [1, 2, 3, 8], [1, 2, 4, 8], [1, 2, 3, 7]])
    plan = plan_shared_prefixes(ids, [3, 3, 3, 3])
    assert plan.src == [0, 2] and plan.inverse.tolist() == [0, 0, 1, 0] and plan.shared_rows == 2
    assert plan_shared_prefixes(ids, [4, 4, 4, 4]) is None  # nothing shared
    assert plan_shared_prefixes(ids, [3, 0, 3, 3]) is None  # an empty prefix


def _grads(model, batch, prefix_len, loss_mask):
    model.zero_grad()
    lp, _ = token_logprobs(
        model,
        batch.input_ids,
        batch.attention_mask,
        loss_mask=loss_mask,
        prefix_len=prefix_len,
        temperature=0.9,
    )
    (lp * torch.linspace(-1, 1, lp.numel()).view_as(lp)).sum().backward()
    return lp.detach(), [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("trained_only", [True, False])
def test_shared_prompts_give_the_plain_logprobs_and_gradients(tokenizer, trained_only):
    """float32: the log-probs to 1e-5 and every parameter's gradient to 1e-4 of its scale (the shared pass sums
    the prompt's gradient over its rows in another order); without a loss mask, positions inside the prompts too."""
    model = make_model(tokenizer).train()
    assert shares_prefixes(model)
    batch = _batch(model.config.vocab_size)
    mask = batch.loss_mask if trained_only else None
    lp_plain, g_plain = _grads(model, batch, None, mask)
    lp_shared, g_shared = _grads(model, batch, batch.prefix_len, mask)
    torch.testing.assert_close(lp_shared, lp_plain, atol=1e-5, rtol=0)
    for a, b in zip(g_shared, g_plain, strict=True):
        torch.testing.assert_close(a, b, atol=1e-4 * float(b.abs().max()) + 1e-8, rtol=0)


def test_shared_rows_sum_their_gradients_in_a_fixed_order():
    """Rows sharing a prompt read its states and cache more than once; the backward sums those reads in a fixed
    order on two threads, so a step repeats to the bit (advanced indexing sums them with atomics there, in no
    fixed order: two runs of one demo step differed in the last bits)."""
    torch.manual_seed(0)
    states = torch.randn(8, 100, 576)
    b, t = torch.randint(0, 8, (3000,)), torch.randint(0, 100, (3000,))
    keys = torch.randn(8, 100, 2 * 48)
    inverse = torch.arange(8).repeat_interleave(8)

    def grads() -> list[torch.Tensor]:
        x, k = states.clone().requires_grad_(), keys.clone().requires_grad_()
        layer = SimpleNamespace(
            keys=k.view(8, 100, 2, 48).transpose(1, 2), values=k.view(8, 100, 2, 48).transpose(1, 2)
        )
        _expand(SimpleNamespace(layers=[layer]), inverse)
        loss = (_rows(x, b, t) * torch.linspace(-1, 1, 3000)[:, None]).sum() + (
            layer.keys * layer.values
        ).sum()
        loss.backward()
        return [x.grad, k.grad]

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        runs = [grads() for _ in range(10)]
    finally:
        torch.set_num_threads(threads)
    torch.testing.assert_close(
        runs[0][0],
        torch.zeros_like(states).index_put_(
            (b, t), torch.linspace(-1, 1, 3000)[:, None].expand(3000, 576), accumulate=True
        ),
    )
    for other in runs[1:]:
        assert all(torch.equal(x, y) for x, y in zip(runs[0], other, strict=True))


def test_shared_prompts_under_bf16_autocast(tokenizer):
    model = make_model(tokenizer).train()
    batch = _batch(model.config.vocab_size, seed=1)
    with torch.no_grad():
        plain, _ = token_logprobs(model, batch.input_ids, batch.attention_mask, loss_mask=batch.loss_mask,
                                  autocast=torch.bfloat16)  # fmt: skip
        shared, _ = token_logprobs(model, batch.input_ids, batch.attention_mask, loss_mask=batch.loss_mask,
                                   autocast=torch.bfloat16, prefix_len=batch.prefix_len)  # fmt: skip
    torch.testing.assert_close(shared, plain, atol=0.05, rtol=0)  # bf16 rounding of two different passes


def test_micro_batched_update_with_shared_prompts_equals_the_plain_one(tokenizer):
    """The trainer's update under a token budget: a prompt's rows kept together and sharing its pass, the same
    accumulated gradient as the plain micro-batches."""
    grads = []
    for share in (False, True):
        torch.manual_seed(0)
        model = make_model(tokenizer).train()
        batch = _batch(model.config.vocab_size, seed=2)
        spec = LossSpec(
            get_policy_loss("ppo"), hyper={"clip_low": 0.2, "clip_high": 0.28, "clip_c": 10.0}, agg="token-mean", norm_len=32,
            temperature=1.0, micro_batch_tokens=40, share_prefix=share,
        )  # fmt: skip
        stats = accumulate_gradients(model, batch, None, None, spec)
        assert stats["loss/micro_batches"] > 1
        grads.append([p.grad.clone() for p in model.parameters()])
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-4 * float(b.abs().max()) + 1e-8, rtol=0)


def _size(part, own, keys, prefix):
    return len({keys[i] for i in part}) * max(prefix[i] for i in part) + len(part) * max(own[i] for i in part)


@pytest.mark.parametrize("seed", range(5))
def test_shared_prefix_parts_cover_every_row_within_the_budget(seed):
    rng = random.Random(seed)
    keys = [k for k in range(6) for _ in range(rng.randint(1, 8))]
    prefix = {k: rng.randint(20, 80) for k in range(6)}
    plen = [prefix[k] for k in keys]
    own = [rng.randint(5, 120) for _ in keys]
    parts = shared_prefix_parts(own, keys, plen, max_tokens=600)
    assert sorted(i for p in parts for i in p) == list(range(len(keys)))
    assert all(p == sorted(p) for p in parts)
    assert all(len(p) == 1 or _size(p, own, keys, plen) <= 600 for p in parts)
    whole = shared_prefix_parts(own, keys, plen, max_tokens=10**9, pass_cost=10**9)
    assert len(whole) == 1  # no budget and passes dear: one pass, every prompt once
