"""`tirl.train.logprobs.token_logprobs` on padded batches: a right-padded batch runs without its attention mask (so
that a GPU takes the fused causal kernels) and keeps the masked pass's numbers at its real positions; a batch
with padding before real tokens, or asked for log-probs at padded positions, keeps its mask."""

from __future__ import annotations

import pytest
import torch

from tirl.train.logprobs import token_logprobs

LENGTHS = (12, 7, 9)


def _batch(vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Three rows of random ids, right-padded to 12 with id 0."""
    g = torch.Generator().manual_seed(0)
    attn = (torch.arange(12)[None, :] < torch.tensor(LENGTHS)[:, None]).long()
    return torch.randint(1, vocab, (3, 12), generator=g) * attn, attn


def _masks_seen(model, monkeypatch) -> list:
    """The attention_mask each call of the decoder receives."""
    seen = []
    decoder = model.get_decoder()
    forward = decoder.forward

    def recording(*args, **kwargs):
        seen.append(kwargs.get("attention_mask"))
        return forward(*args, **kwargs)

    monkeypatch.setattr(decoder, "forward", recording)
    return seen


def test_right_padded_rows_run_unmasked_with_the_masked_numbers(model, monkeypatch):
    ids, attn = _batch(model.config.vocab_size)
    with torch.no_grad():  # the masked pass, as transformers runs it with the mask
        logits = model(input_ids=ids, attention_mask=attn).logits.float()
    want = torch.log_softmax(logits, -1)[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)  # (B, T - 1)
    seen = _masks_seen(model, monkeypatch)
    got, _ = token_logprobs(model, ids, attn, loss_mask=attn)
    assert seen == [None]
    real = attn[:, 1:].bool()
    torch.testing.assert_close(got[:, 1:][real], want[real])
    assert not got[:, 1:][~real].any()  # padding is not trained: nothing computed there


@pytest.mark.parametrize("case", ["left-padded", "padding wanted"])
def test_the_mask_stays_where_padding_could_change_a_wanted_number(model, monkeypatch, case):
    """Padding before real tokens, or log-probs wanted at padded positions too (no loss mask)."""
    ids, attn = _batch(model.config.vocab_size)
    if case == "left-padded":
        ids, attn = ids.flip(1), attn.flip(1)
    seen = _masks_seen(model, monkeypatch)
    token_logprobs(model, ids, attn, loss_mask=attn if case == "left-padded" else None)
    assert len(seen) == 1 and torch.equal(seen[0], attn)
