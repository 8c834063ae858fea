import pytest
import torch

from tirl.rollout.engines.torch.engine import TorchEngine
from tirl.rollout.sampling import SamplingParams, sample_next
from tirl.train.batch import collate
from tirl.train.logprobs import token_logprobs


def _engine(model, tokenizer, **kw):
    return TorchEngine(model, eos_ids=[tokenizer.eos_token_id], pad_id=tokenizer.pad_token_id, **kw)


def _prompts(renderer):
    return [
        renderer.prompt_ids([{"role": "user", "content": q}])
        for q in (
            "What is 12 * 34?",
            "What is 1 + 2 + 3?",
            "A shop has 964 boxes with 59 pens each. How many?",
        )
    ]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_engine_logprobs_equal_trainer_recomputation(model, tokenizer, renderer, temperature):
    prompts = _prompts(renderer)
    gens = _engine(model, tokenizer, max_batch_size=2).generate(
        prompts,
        SamplingParams(temperature=temperature),
        max_new_tokens=[20, 7, 13],
        generator=torch.Generator().manual_seed(0),
    )
    assert [len(g.token_ids) for g in gens] == [len(g.logprobs) for g in gens]
    assert all(len(g.token_ids) <= m for g, m in zip(gens, [20, 7, 13]))
    ids = [p + g.token_ids for p, g in zip(prompts, gens)]
    masks = [[0] * len(p) + [1] * len(g.token_ids) for p, g in zip(prompts, gens)]
    batch = collate(ids, masks, pad_id=tokenizer.pad_token_id)
    with torch.no_grad():
        lp, _ = token_logprobs(model, batch.input_ids, batch.attention_mask, temperature=temperature)
    for b, (p, g) in enumerate(zip(prompts, gens)):
        recomputed = lp[b, len(p) : len(p) + len(g.token_ids)]
        torch.testing.assert_close(recomputed, torch.tensor(g.logprobs), atol=1e-4, rtol=0)


def test_same_seed_same_samples(model, tokenizer, renderer):
    engine = _engine(model, tokenizer)
    runs = [
        engine.generate(
            _prompts(renderer),
            SamplingParams(),
            max_new_tokens=16,
            generator=torch.Generator().manual_seed(3),
        )
        for _ in range(2)
    ]
    assert [g.token_ids for g in runs[0]] == [g.token_ids for g in runs[1]]


def test_batched_greedy_equals_one_by_one(model, tokenizer, renderer):
    """Left padding and the KV cache must not change what a sequence generates."""
    engine = _engine(model, tokenizer)
    params = SamplingParams(temperature=0.0)
    batched = engine.generate(_prompts(renderer), params, max_new_tokens=12)
    single = [engine.generate([p], params, max_new_tokens=12)[0] for p in _prompts(renderer)]
    assert [g.token_ids for g in batched] == [g.token_ids for g in single]


def _force(model, token_id):
    """Make `token_id` the model's every choice (a forward hook on the output layer)."""
    bias = torch.zeros(model.config.vocab_size)
    bias[token_id] = 100.0
    return model.lm_head.register_forward_hook(lambda mod, inp, out: out + bias)


def test_stops_at_stop_token(model, tokenizer, renderer):
    stop = tokenizer.convert_tokens_to_ids("</tool_call>")
    handle = _force(model, stop)
    try:
        gens = _engine(model, tokenizer, stop_ids=[stop]).generate(
            _prompts(renderer), SamplingParams(), max_new_tokens=10
        )
        assert all(g.token_ids == [stop] and g.finish_reason == "stop" for g in gens)
        gens = _engine(model, tokenizer).generate(_prompts(renderer), SamplingParams(), max_new_tokens=5)
        assert all(g.token_ids == [stop] * 5 and g.finish_reason == "length" for g in gens)
    finally:
        handle.remove()


def test_stops_at_eos(model, tokenizer, renderer):
    handle = _force(model, tokenizer.eos_token_id)
    try:
        gens = _engine(model, tokenizer).generate(_prompts(renderer), SamplingParams(), max_new_tokens=10)
        assert all(g.token_ids == [tokenizer.eos_token_id] and g.finish_reason == "eos" for g in gens)
    finally:
        handle.remove()


def test_zero_budget_and_bad_input(model, tokenizer, renderer):
    engine = _engine(model, tokenizer)
    gens = engine.generate(_prompts(renderer), SamplingParams(), max_new_tokens=[0, 3, 0])
    assert [len(g.token_ids) for g in gens] == [0, 3, 0]
    with pytest.raises(ValueError, match="empty prompt"):
        engine.generate([[]], SamplingParams())
    with pytest.raises(ValueError, match="entries for 3 prompts"):
        engine.generate(_prompts(renderer), SamplingParams(), max_new_tokens=[1])


def test_top_k_and_top_p_restrict_support():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    g = torch.Generator().manual_seed(0)
    seen_k = {int(sample_next(logits, SamplingParams(top_k=2), g)[0]) for _ in range(200)}
    assert seen_k == {0, 1}
    seen_p = {int(sample_next(logits, SamplingParams(top_p=0.7), g)[0]) for _ in range(200)}
    assert seen_p == {0, 1}  # 0.5 < 0.7, 0.5 + 0.3 >= 0.7
    tok, lp = sample_next(logits, SamplingParams(temperature=0.0))
    assert int(tok) == 0
    torch.testing.assert_close(lp, torch.log(torch.tensor([0.5])))


def test_sampling_params_validation():
    for kw in ({"temperature": -1}, {"top_p": 0.0}, {"top_p": 1.5}, {"max_new_tokens": 0}):
        with pytest.raises(ValueError):
            SamplingParams(**kw)


def test_bf16_decode_samples_near_the_fp32_distribution(model, tokenizer, renderer):
    """`rollout.dtype: bfloat16`: the same sampler under bf16 autocast; its log-probs stay within bf16 rounding of
    the trainer's fp32 recomputation, and the model's weights stay fp32."""
    prompts = _prompts(renderer)
    engine = _engine(model, tokenizer, compute_dtype=torch.bfloat16)
    gens = engine.generate(
        prompts, SamplingParams(), max_new_tokens=12, generator=torch.Generator().manual_seed(0)
    )
    assert all(p.dtype == torch.float32 for p in model.parameters())
    ids = [p + g.token_ids for p, g in zip(prompts, gens)]
    masks = [[0] * len(p) + [1] * len(g.token_ids) for p, g in zip(prompts, gens)]
    batch = collate(ids, masks, pad_id=tokenizer.pad_token_id)
    with torch.no_grad():
        lp, _ = token_logprobs(model, batch.input_ids, batch.attention_mask)
    diffs = torch.cat(
        [
            lp[b, len(p) : len(p) + len(g.token_ids)] - torch.tensor(g.logprobs)
            for b, (p, g) in enumerate(zip(prompts, gens))
        ]
    )
    assert 0 < diffs.abs().max() < 0.5  # bf16 moves them (not the fp32 numbers), but only by rounding
    with pytest.raises(ValueError, match="fp32 or under bfloat16 autocast"):
        _engine(model, tokenizer, compute_dtype=torch.float16)
