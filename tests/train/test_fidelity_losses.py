"""rl.token_mean and sft.loss_mean in both modes: tirl's exact token means and verl's per-micro-batch ones."""

import pytest
import torch
from test_micro_batches import _batch

from conftest import make_model
from tirl.algorithms import aggregate, get_policy_loss
from tirl.train.batch import micro_batches, slice_rows
from tirl.train.rl.update import LossSpec, accumulate_gradients, micro_norm
from tirl.train.sft import SFTConfig, sft_loss, sft_step


def test_micro_norm_by_hand():
    # micro-batch A: 1 row, tokens 1 and 3 (mean 2); B: 3 rows, four tokens of 1 (mean 1); 4 rows in all
    a_vals, a_mask = torch.tensor([[1.0, 3.0]]), torch.ones(1, 2)
    b_vals, b_mask = torch.ones(3, 2), torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 0.0]])
    norm = {"norm_len": None, "num_tokens": 6.0, "num_seqs": 4.0}
    exact = sum(aggregate(v, m, "token-mean", **norm) for v, m in ((a_vals, a_mask), (b_vals, b_mask)))
    verl = aggregate(a_vals, a_mask, "token-mean", **micro_norm(norm, a_mask, 1, 4.0)) + aggregate(
        b_vals, b_mask, "token-mean", **micro_norm(norm, b_mask, 3, 4.0)
    )
    assert float(exact) == pytest.approx(8 / 6, abs=1e-7)  # every token weighs the same
    assert float(verl) == pytest.approx(0.25 * 2 + 0.75 * 1, abs=1e-7)  # each micro-batch's mean, by its rows


def _spec(token_mean: str, **split) -> LossSpec:
    return LossSpec(
        get_policy_loss("ppo"),
        {"clip_low": 0.2, "clip_high": 0.28, "clip_c": 10.0},
        "token-mean",
        1,
        1.0,
        token_mean=token_mean,
        **split,
    )


def test_rl_token_mean_on_policy_losses(tokenizer):
    # on-policy the ratio is 1, so each token's loss is -A: the totals can be written down from the advantages
    model = make_model(tokenizer).train()
    batch, _, _ = _batch(tokenizer)
    adv = batch.extra["advantages"][:, 0]  # (B,) one advantage per row
    tokens = batch.loss_mask.sum(dim=1).float()  # (B,)
    exact = accumulate_gradients(model, batch, None, None, _spec("exact", micro_batch_size=1))
    verl = accumulate_gradients(model, batch, None, None, _spec("micro", micro_batch_size=1))
    assert exact["loss/total"] == pytest.approx(float(-(adv * tokens).sum() / tokens.sum()), rel=1e-5)
    trained = tokens > 0  # a micro-batch without trained tokens adds 0 but still counts among the rows
    assert verl["loss/total"] == pytest.approx(float(-(adv[trained]).sum() / len(adv)), rel=1e-5)


def test_rl_token_mean_micro_equals_exact_with_one_micro_batch(tokenizer):
    model = make_model(tokenizer).train()
    batch, _, _ = _batch(tokenizer)
    grads = []
    for mode in ("exact", "micro"):
        model.zero_grad(set_to_none=True)
        accumulate_gradients(model, batch, None, None, _spec(mode))
        grads.append([p.grad.clone() for p in model.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b)


def test_sft_loss_mean_micro_is_the_mean_of_micro_batch_token_means(tokenizer):
    model = make_model(tokenizer).train()
    batch, _, _ = _batch(tokenizer)
    lengths = batch.attention_mask.sum(dim=-1).tolist()
    parts = list(micro_batches(lengths, max_seqs=3, max_tokens=0))
    with torch.no_grad():
        means = [float(sft_loss(model, slice_rows(batch, rows))[0]) for rows in parts]
        whole = float(sft_loss(model, batch)[0])
    token, _ = sft_step(model, batch, SFTConfig(micro_batch_size=3))
    micro, _ = sft_step(model, batch, SFTConfig(micro_batch_size=3, loss_mean="micro"))
    assert token == pytest.approx(whole, rel=1e-5)
    assert micro == pytest.approx(sum(means) / len(means), rel=1e-5)
    assert abs(micro - token) > 1e-4  # the two normalizations differ on this batch
