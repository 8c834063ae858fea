"""The static decode's view of the policy (`tirl.rollout.engines.torch.graph_model`): attention over grouped heads equals
attention over heads expanded as transformers expands them; the view shares the trainer's tensors, and its bf16
copies follow the trainer's weights in place."""

from __future__ import annotations

import torch

from tirl.rollout.engines.torch.graph_model import STATIC_ATTENTION, grouped_decode_attention, rollout_weights


def test_grouped_heads_attend_as_expanded_ones():
    torch.manual_seed(0)
    B, Hq, Hkv, C, D = 3, 8, 2, 11, 16
    q, k, v = torch.randn(B, Hq, 1, D), torch.randn(B, Hkv, C, D), torch.randn(B, Hkv, C, D)
    mask = torch.rand(B, 1, 1, C) > 0.3
    mask[..., -1] = True
    got, _ = grouped_decode_attention(None, q, k, v, mask, scaling=0.25)
    expand = lambda t: t.repeat_interleave(Hq // Hkv, dim=1)  # noqa: E731  transformers' repeat_kv
    want = torch.nn.functional.scaled_dot_product_attention(
        q, expand(k), expand(v), attn_mask=mask, scale=0.25
    )
    torch.testing.assert_close(got, want.transpose(1, 2))  # (B, 1, Hq, D)


def test_the_view_shares_the_trainers_tensors_and_refreshes_its_copies_in_place(model):
    plain = rollout_weights(model, None)
    assert not plain.copies and plain.module.config._attn_implementation == STATIC_ATTENTION
    assert model.config._attn_implementation == "sdpa"  # the trainer's module is untouched
    assert all(a is b for a, b in zip(plain.module.parameters(), model.parameters(), strict=True))
    w = rollout_weights(model, torch.bfloat16)
    up = w.module.model.layers[0].mlp.up_proj.weight
    assert up.dtype == torch.bfloat16 and model.model.layers[0].mlp.up_proj.weight.dtype == torch.float32
    ptr = up.data_ptr()
    with torch.no_grad():
        model.model.layers[0].mlp.up_proj.weight.mul_(2.0)  # in place: its version counter moves
    assert w.refresh()
    assert up.data_ptr() == ptr and torch.equal(up, model.model.layers[0].mlp.up_proj.weight.bfloat16())
    assert not w.refresh()  # nothing changed since
    model.model.layers[0].mlp.up_proj.weight.data.mul_(2.0)  # through .data: no counter moves
    assert not w.refresh() and w.refresh(every=True)
    assert torch.equal(up, model.model.layers[0].mlp.up_proj.weight.bfloat16())
