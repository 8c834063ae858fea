"""model.autocast=bfloat16: the forward/backward run in bf16 while weights, gradients, AdamW state and the
log-softmax stay float32; the loss is finite and close to the float32 one."""

import pytest
import torch

from conftest import make_model
from tirl.algorithms import get_policy_loss
from tirl.train.batch import collate
from tirl.train.logprobs import token_logprobs
from tirl.train.optim import OptimConfig, build_optimizer, clip_and_step
from tirl.train.rl.update import LossSpec, accumulate_gradients


def _batch(tokenizer, B=6):
    g = torch.Generator().manual_seed(0)
    ids = [
        torch.randint(3, 60, (int(torch.randint(8, 16, (1,), generator=g)),), generator=g).tolist()
        for _ in range(B)
    ]
    masks = [[0] * 3 + [1] * (len(x) - 3) for x in ids]
    adv = [[float(torch.randn(1, generator=g))] * len(x) for x in ids]
    return collate(ids, masks, pad_id=tokenizer.pad_token_id, extra={"advantages": adv})


def _step(model, batch, autocast):
    spec = LossSpec(
        get_policy_loss("ppo"), hyper={"clip_low": 0.2, "clip_high": 0.28, "clip_c": 3.0}, agg="token-mean", norm_len=16,
        temperature=1.0, kl_coef=0.1, autocast=autocast, chunk_tokens=8,
    )  # fmt: skip
    with torch.no_grad():
        ref, _ = token_logprobs(model, batch.input_ids, batch.attention_mask, loss_mask=batch.loss_mask)
    opt, sched = build_optimizer(model, OptimConfig(lr=1e-3), 1)
    stats = accumulate_gradients(model, batch, None, ref - 0.1, spec)
    grads = [p.grad.clone() for p in model.parameters()]
    clip_and_step(model, opt, sched, OptimConfig(lr=1e-3), loss=stats["loss/total"])
    return stats, grads, opt


def test_autocast_step_is_finite_close_to_fp32_and_keeps_fp32_state(tokenizer):
    batch = _batch(tokenizer)
    full, full_grads, _ = _step(make_model(tokenizer, seed=4).train(), batch, None)
    model = make_model(tokenizer, seed=4).train()
    amp, amp_grads, opt = _step(model, batch, torch.bfloat16)
    assert torch.isfinite(torch.tensor(amp["loss/total"]))
    assert amp["loss/kl"] == pytest.approx(full["loss/kl"], abs=0.02)  # bf16 keeps ~3 significant digits
    assert amp["loss/total"] == pytest.approx(full["loss/total"], abs=0.02)
    cos = torch.nn.functional.cosine_similarity(torch.cat([g.flatten() for g in amp_grads]),
                                                torch.cat([g.flatten() for g in full_grads]), dim=0)  # fmt: skip
    assert cos > 0.99
    assert all(p.dtype == torch.float32 for p in model.parameters())  # master weights
    assert all(g.dtype == torch.float32 for g in amp_grads)
    states = [s for s in opt.state.values()]
    assert states and all(s["exp_avg"].dtype == torch.float32 for s in states)


def test_autocast_logprobs_are_float32_and_close(tokenizer):
    model = make_model(tokenizer, seed=5)
    batch = _batch(tokenizer)
    args = (model, batch.input_ids, batch.attention_mask)
    with torch.no_grad():
        full, _ = token_logprobs(*args, loss_mask=batch.loss_mask)
        amp, ent = token_logprobs(
            *args, loss_mask=batch.loss_mask, autocast=torch.bfloat16, with_entropy=True
        )
    assert amp.dtype == torch.float32 and ent.dtype == torch.float32
    assert torch.isfinite(amp).all()
    assert (amp - full).abs().max() < 0.05  # bf16 matmuls, float32 log-softmax
    assert (amp - full).abs().max() > 0  # autocast really ran in bf16
