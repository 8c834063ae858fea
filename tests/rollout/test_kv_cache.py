"""The in-place KV cache against transformers' DynamicCache: the same ids and log-probs to the bit, greedy and
sampled, with rows dropped as they finish, and against Hugging Face `generate`'s greedy ids."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

import tirl.rollout.engine as engine_mod
from conftest import make_model
from tirl.rollout.engine import TorchEngine
from tirl.rollout.kv_cache import InPlaceCache, InPlaceLayer
from tirl.rollout.sampling import SamplingParams


def prompts(n: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(10, 200, (int(k),), generator=g).tolist() for k in torch.randint(2, 30, (n,), generator=g)]


def run(model, eos: int, cache_cls, params, monkeypatch, budgets) -> list:
    monkeypatch.setattr(engine_mod, "InPlaceCache", cache_cls)
    eng = TorchEngine(model, eos_ids=[eos], pad_id=0, max_batch_size=8)
    with torch.no_grad():
        return eng.generate(prompts(12), params, max_new_tokens=budgets, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_same_ids_and_logprobs_as_dynamic_cache(tokenizer, monkeypatch, temperature):
    model = make_model(tokenizer)
    budgets = [5, 40, 17, 1, 33, 40, 2, 40, 9, 25, 40, 12]
    eos = 42  # a common token: rows finish at different steps and are dropped from the cache
    params = SamplingParams(temperature=temperature)
    fast = run(model, eos, InPlaceCache, params, monkeypatch, budgets)
    slow = run(model, eos, lambda capacity: DynamicCache(), params, monkeypatch, budgets)
    assert [g.token_ids for g in fast] == [g.token_ids for g in slow]
    assert [g.logprobs for g in fast] == [g.logprobs for g in slow]
    assert [g.finish_reason for g in fast] == [g.finish_reason for g in slow]
    assert len({len(g.token_ids) for g in fast}) > 3  # rows really ended at different steps


def test_greedy_ids_equal_hugging_face_generate(tokenizer):
    model = make_model(tokenizer)
    eng = TorchEngine(model, eos_ids=[tokenizer.eos_token_id], pad_id=tokenizer.pad_token_id)
    ps = prompts(4, seed=3)
    with torch.no_grad():
        ours = eng.generate(ps, SamplingParams(temperature=0.0), max_new_tokens=24)
        for p, g in zip(ps, ours):
            ref = model.generate(torch.tensor([p]), max_new_tokens=24, do_sample=False, min_new_tokens=24,
                                 pad_token_id=tokenizer.pad_token_id)[0, len(p):].tolist()  # fmt: skip
            assert g.token_ids == ref[: len(g.token_ids)]


def test_capacity_is_enforced():
    layer = InPlaceLayer(capacity=3)
    k = torch.zeros(1, 2, 2, 4)
    layer.update(k, k)
    assert layer.get_seq_length() == 2 and layer.keys.shape == (1, 2, 2, 4)
    with pytest.raises(RuntimeError, match="KV cache full"):
        layer.update(k, k)
    with pytest.raises(ValueError, match="capacity"):
        InPlaceCache(0)
