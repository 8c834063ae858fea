"""Micro-batches: the accumulated gradient of a mini-batch does not depend on how it is split."""

import pytest
import torch

from conftest import make_model
from tirl.algorithms import get_policy_loss
from tirl.train.batch import collate, micro_batches, slice_rows
from tirl.train.logprobs import token_logprobs
from tirl.train.rl.update import LossSpec, accumulate_gradients


def _batch(tokenizer, B=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids, masks = [], []
    for b in range(B):
        n = int(torch.randint(6, 20, (1,), generator=g))
        ids.append(torch.randint(3, 60, (n,), generator=g).tolist())
        m = [0] * 3 + (torch.rand(n - 3, generator=g) > 0.3).long().tolist()
        masks.append(m if b != 5 else [0] * n)  # one sequence with nothing to train
    adv = [[float(torch.randn(1, generator=g))] * len(x) for x in ids]
    batch = collate(ids, masks, pad_id=tokenizer.pad_token_id, extra={"advantages": adv})
    old = torch.randn(batch.input_ids.shape, generator=g) * 0.3  # log-ratio noise: every clip branch is used
    ref = torch.randn(batch.input_ids.shape, generator=g) * 0.3
    return batch, old, ref


def _grads(model, batch, old, ref, spec):
    model.zero_grad(set_to_none=True)
    with torch.no_grad():
        lp, _ = token_logprobs(model, batch.input_ids, batch.attention_mask, loss_mask=batch.loss_mask)
    stats = accumulate_gradients(model, batch, lp + old, lp + ref, spec)
    return [p.grad.clone() for p in model.parameters()], stats


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_gradient_is_independent_of_the_split(tokenizer, agg):
    torch.manual_seed(0)
    model = make_model(tokenizer).train()
    batch, old, ref = _batch(tokenizer)
    base = dict(
        loss_fn=get_policy_loss("ppo"),
        hyper={"clip_low": 0.2, "clip_high": 0.28, "clip_c": 3.0},
        agg=agg,
        norm_len=24,
        temperature=0.8,
        kl_coef=0.1,
        entropy_coef=0.01,
    )
    ref_grads, ref_stats = _grads(model, batch, old, ref, LossSpec(**base, chunk_tokens=7))
    assert ref_stats["loss/micro_batches"] == 1.0
    for split in (
        {"micro_batch_size": 1},
        {"micro_batch_size": 2},
        {"micro_batch_size": 4},
        {"micro_batch_tokens": 40},
    ):
        grads, stats = _grads(model, batch, old, ref, LossSpec(**base, **split, chunk_tokens=5))
        assert stats["loss/micro_batches"] > 1
        for a, b in zip(ref_grads, grads):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)  # fp32 sums in another order
        assert stats["loss/total"] == pytest.approx(ref_stats["loss/total"], rel=1e-5)
        assert stats["loss/pg"] == pytest.approx(ref_stats["loss/pg"], rel=1e-5)
        assert stats["loss/clipfrac"] == pytest.approx(ref_stats["loss/clipfrac"], rel=1e-5)


def test_chunked_logprobs_equal_the_full_softmax(tokenizer):
    torch.manual_seed(0)
    model = make_model(tokenizer)
    batch, _, _ = _batch(tokenizer)
    logits = (
        model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, :-1].float() / 0.7
    )
    full = logits.log_softmax(-1).gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)  # (B, T-1)
    lp, ent = token_logprobs(
        model,
        batch.input_ids,
        batch.attention_mask,
        temperature=0.7,
        with_entropy=True,
        loss_mask=batch.loss_mask,
        chunk_tokens=3,
    )
    sel = batch.loss_mask[:, 1:].bool()
    torch.testing.assert_close(lp[:, 1:][sel], full[sel])
    assert (lp[:, 1:][~sel] == 0).all() and (lp[:, 0] == 0).all()
    p = logits.softmax(-1)
    torch.testing.assert_close(ent[:, 1:][sel], -(p * logits.log_softmax(-1)).sum(-1)[sel])


def test_micro_batch_split_and_slicing(tokenizer):
    assert micro_batches([3, 5, 2, 7, 1], max_seqs=2) == [[0, 1], [2, 3], [4]]
    assert micro_batches([3, 5, 2, 7, 1], max_tokens=10) == [[0, 1], [2], [3], [4]]
    assert micro_batches([30, 5], max_tokens=10) == [[0], [1]]  # too long alone: its own micro-batch
    assert micro_batches([3, 5]) == [[0, 1]]
    with pytest.raises(ValueError, match=">= 0"):
        micro_batches([1], max_seqs=-1)
    batch, _, _ = _batch(tokenizer)
    part = slice_rows(batch, [0, 2])
    assert part.input_ids.shape[1] == int(batch.attention_mask[[0, 2]].sum(-1).max())
    torch.testing.assert_close(part.loss_mask, batch.loss_mask[[0, 2], : part.input_ids.shape[1]])


def test_sft_gradient_is_independent_of_the_split(tokenizer):
    from tirl.train.sft import SFTConfig, sft_step

    torch.manual_seed(0)
    model = make_model(tokenizer).train()
    batch, _, _ = _batch(tokenizer)
    out = []
    for split in ({}, {"micro_batch_size": 3}, {"micro_batch_tokens": 30}):
        model.zero_grad(set_to_none=True)
        loss, n = sft_step(model, batch, SFTConfig(**split))
        out.append((loss, n, [p.grad.clone() for p in model.parameters()]))
    for loss, n, grads in out[1:]:
        assert n == out[0][1] and loss == pytest.approx(out[0][0], rel=1e-5)
        for a, b in zip(out[0][2], grads):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_gradient_checkpointing_leaves_the_rl_gradient_unchanged(tokenizer):
    """model.gradient_checkpointing recomputes activations in backward; the accumulated RL gradient is the same."""
    from tirl.models.loading import enable_gradient_checkpointing

    batch, old, ref = _batch(tokenizer)
    spec = LossSpec(
        loss_fn=get_policy_loss("ppo"),
        hyper={"clip_low": 0.2, "clip_high": 0.28, "clip_c": 3.0},
        agg="token-mean",
        norm_len=24,
        temperature=0.8,
        kl_coef=0.1,
        entropy_coef=0.01,
        micro_batch_size=3,
        chunk_tokens=7,
    )
    plain, _ = _grads(make_model(tokenizer, seed=2).train(), batch, old, ref, spec)
    model = make_model(tokenizer, seed=2).train()
    enable_gradient_checkpointing(model)
    checked, _ = _grads(model, batch, old, ref, spec)
    for a, b in zip(plain, checked):
        torch.testing.assert_close(a, b)
