"""model.gradient_checkpointing trades memory for recompute; the gradients must not change.

The flag is read through `tirl.train.logprobs.checkpointing`, as the trainer reads it: transformers 5.x renamed
`is_gradient_checkpointing` to `is_activation_checkpointing` in some releases and not in others (5.17 has only the
old name), and the test must hold on each."""

import pytest
import torch

from conftest import make_model
from tirl.models.loading import ModelConfig, enable_gradient_checkpointing, load_model
from tirl.train.logprobs import checkpointing


def _grads(model, ids):
    model.train()
    model.zero_grad()
    logits = model(input_ids=ids).logits  # (B, T, V)
    torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten()).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def test_checkpointing_gives_the_same_gradients(tokenizer):
    ids = torch.randint(0, 100, (2, 12), generator=torch.Generator().manual_seed(0))
    plain = _grads(make_model(tokenizer, seed=3), ids)
    model = make_model(tokenizer, seed=3)
    enable_gradient_checkpointing(model)
    assert checkpointing(model)
    checked = _grads(model, ids)
    assert plain.keys() == checked.keys()
    for name in plain:
        torch.testing.assert_close(checked[name], plain[name], msg=name)


def test_unknown_dtype_is_refused():
    with pytest.raises(ValueError, match="model.dtype"):
        ModelConfig(dtype="float8")


def test_load_model_applies_the_option(tokenizer, tmp_path):
    make_model(tokenizer, seed=1).save_pretrained(tmp_path)
    assert checkpointing(load_model(ModelConfig(path=str(tmp_path), gradient_checkpointing=True)))
    assert not checkpointing(load_model(ModelConfig(path=str(tmp_path))))
