"""The in-place KV cache against transformers' DynamicCache: the same ids and log-probs to the bit, greedy and
sampled, with rows dropped as they finish, and against Hugging Face `generate`'s greedy ids."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

import tirl.rollout.engines.torch.engine as engine_mod
from conftest import make_model
from tirl.rollout.engines.torch.engine import TorchEngine
from tirl.rollout.engines.torch.kv_cache import InPlaceCache, InPlaceLayer
from tirl.rollout.sampling import SamplingParams


def prompts(n: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randint(10, 200, (int(k),), generator=g).tolist()
        for k in torch.randint(2, 30, (n,), generator=g)
    ]


def run(model, eos: int, cache_cls, params, monkeypatch, budgets) -> list:
    monkeypatch.setattr(engine_mod, "InPlaceCache", cache_cls)
    eng = TorchEngine(model, eos_ids=[eos], pad_id=0, max_batch_size=8)
    with torch.no_grad():
        return eng.generate(
            prompts(12), params, max_new_tokens=budgets, generator=torch.Generator().manual_seed(1)
        )


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


def two_turns(model, eos: int, keep_mib: int, temperature: float) -> tuple[list, list, TorchEngine]:
    """A turn, then a second one whose prompts extend the first's rows (sampled ids plus a few 'tool' tokens),
    as the agent loop sends them."""
    eng = TorchEngine(model, eos_ids=[eos], pad_id=0, max_batch_size=8, keep_prefix_mib=keep_mib)
    first_prompts = prompts(12)
    budgets = [5, 40, 17, 1, 33, 40, 2, 40, 9, 25, 40, 12]
    params = SamplingParams(temperature=temperature)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        first = eng.generate(first_prompts, params, max_new_tokens=budgets, generator=gen)
        tool = prompts(12, seed=5)
        # tool outputs of different lengths: the rows' new tokens sort otherwise than their whole contexts
        second_prompts = [
            p + g.token_ids + (t * 3)[: 1 + 7 * (i % 3)]
            for i, (p, g, t) in enumerate(zip(first_prompts, first, tool, strict=True))
        ]
        second = eng.generate(second_prompts, params, max_new_tokens=20, generator=gen)
    return first, second, eng


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_kept_prefixes_continue_like_a_full_prefill(tokenizer, temperature):
    """The second turn pre-fills only the new tokens of each row, and samples what a full pre-fill would: the same
    ids (greedy and seeded) and log-probs to float rounding."""
    model = make_model(tokenizer)
    eos = 42
    first, second, eng = two_turns(model, eos, 1024, temperature)
    first_ref, second_ref, ref = two_turns(model, eos, 0, temperature)
    assert ref.kept.reused_tokens == 0
    expected = sum(len(p) + len(g.token_ids) - 1 for p, g in zip(prompts(12), first, strict=True))
    assert eng.kept.reused_tokens == expected  # every row continued from its kept prefix
    assert [g.token_ids for g in first] == [g.token_ids for g in first_ref]
    assert [g.token_ids for g in second] == [g.token_ids for g in second_ref]
    for a, b in zip(second, second_ref, strict=True):
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4)


def test_kept_prefixes_are_dropped_when_the_weights_change_or_over_budget(tokenizer):
    model = make_model(tokenizer)
    eng = TorchEngine(model, eos_ids=[42], pad_id=0, keep_prefix_mib=1024)
    ps = prompts(3)
    with torch.no_grad():
        g = eng.generate(ps, SamplingParams(temperature=0.0), max_new_tokens=6)
        eng.sync_weights(model)  # a new policy: the kept keys and values are stale
        eng.generate(
            [p + x.token_ids + [7] for p, x in zip(ps, g)], SamplingParams(temperature=0.0), max_new_tokens=3
        )
    assert eng.kept.reused_tokens == 0
    tiny = TorchEngine(model, eos_ids=[42], pad_id=0)
    tiny.kept.max_bytes = 1  # the first row fills the budget, the others are not kept
    with torch.no_grad():
        g = tiny.generate(ps, SamplingParams(temperature=0.0), max_new_tokens=6)
        tiny.generate(
            [p + x.token_ids + [7] for p, x in zip(ps, g)], SamplingParams(temperature=0.0), max_new_tokens=3
        )
    assert 0 < tiny.kept.reused_tokens < sum(len(p) + len(x.token_ids) - 1 for p, x in zip(ps, g))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_prefill_in_passes_of_similar_lengths(tokenizer, monkeypatch, temperature):
    """Short and long prompts are pre-filled in separate passes and joined in one cache: the same ids, greedy and
    seeded, and log-probs to float rounding, as one left-padded pass over all of them."""
    model = make_model(tokenizer)
    short, long = prompts(6, seed=7), [p * 12 for p in prompts(6, seed=8)]  # ~5-30 and ~60-360 tokens
    ps = [x for pair in zip(short, long, strict=True) for x in pair]
    passes = []
    split = engine_mod.least_padding_parts

    def run(one_pass: bool) -> list:
        monkeypatch.setattr(
            engine_mod, "least_padding_parts",
            (lambda lengths, **kw: [list(range(len(lengths)))]) if one_pass else (lambda lengths, **kw: passes.append(split(lengths, **kw)) or passes[-1]),
        )  # fmt: skip
        eng = TorchEngine(model, eos_ids=[42], pad_id=0)
        with torch.no_grad():
            return eng.generate(ps, SamplingParams(temperature=temperature), max_new_tokens=12,
                                generator=torch.Generator().manual_seed(3))  # fmt: skip

    split_run, whole = run(False), run(True)
    assert len(passes[0]) > 1  # the short rows were pre-filled apart from the long ones
    assert [g.token_ids for g in split_run] == [g.token_ids for g in whole]
    for a, b in zip(split_run, whole, strict=True):
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4)


def test_float32_keys_are_kept_in_autocasts_dtype_with_the_same_numbers(tokenizer, monkeypatch):
    """Qwen3's key norm returns float32 keys under bf16 autocast: the cache keeps them in bf16 (half the memory),
    and since attention casts them to bf16 as it reads them, ids and log-probs are those of float32 storage."""
    from transformers import AutoModelForCausalLM, Qwen3Config

    from tirl.rollout.engines.torch import kv_cache

    cfg = Qwen3Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16)  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa", dtype=torch.float32).eval()
    stored = []
    init = InPlaceLayer.lazy_initialization

    def spy(self, k, v):
        init(self, k, v)
        stored.append((k.dtype, self._k.dtype))

    monkeypatch.setattr(InPlaceLayer, "lazy_initialization", spy)

    def decode() -> list:
        eng = TorchEngine(model, eos_ids=[42], pad_id=0, max_batch_size=8, compute_dtype=torch.bfloat16)
        with torch.no_grad():
            return eng.generate(prompts(6), SamplingParams(temperature=1.0), max_new_tokens=12,
                                generator=torch.Generator().manual_seed(1))  # fmt: skip

    cast = decode()
    assert set(stored) == {(torch.float32, torch.bfloat16)}
    monkeypatch.setattr(kv_cache, "stored_dtype", lambda states: states.dtype)  # as they come: float32
    stored.clear()
    kept = decode()
    assert set(stored) == {(torch.float32, torch.float32)}
    assert [(g.token_ids, g.logprobs) for g in cast] == [(g.token_ids, g.logprobs) for g in kept]
