"""The sampler's draw (inverse CDF, one uniform per row) and the engine's shared pre-fill of identical prompts."""

import math

import pytest
import torch

from tirl.rollout.engines.torch.engine import TorchEngine, unique_rows
from tirl.rollout.sampling import SamplingParams, draw, sample_next


def test_draw_follows_the_distribution():
    """200,000 draws from a 5-token distribution with a zero entry: each frequency within 4.5 standard errors of
    its probability (a fixed seed: the same draws every run), the zero entry never drawn, and a chi-square
    statistic below the 99.9% quantile of its distribution (18.5 for 4 degrees of freedom)."""
    p = torch.tensor([0.5, 0.25, 0.0, 0.15, 0.1])
    n = 200_000
    g = torch.Generator().manual_seed(0)
    counts = torch.bincount(draw(p.expand(n, -1), g), minlength=5).double()
    assert counts[2] == 0
    freq = counts / n
    se = (p.double() * (1 - p.double()) / n).sqrt()
    assert ((freq - p.double()).abs() <= 4.5 * se + 1e-12).all(), freq
    kept = p > 0
    chi2 = float((((counts - n * p.double()) ** 2) / (n * p.double()))[kept].sum())
    assert chi2 < 18.5


def test_draw_takes_unnormalized_rows_and_rows_of_one_token():
    g = torch.Generator().manual_seed(1)
    probs = torch.tensor([[0.0, 0.0, 3.0], [2.0, 0.0, 0.0], [1e-30, 0.0, 0.0]])  # one live token per row
    for _ in range(50):
        assert draw(probs, g).tolist() == [2, 0, 0]


def test_draw_is_seeded_and_uses_one_uniform_per_row():
    probs = torch.softmax(torch.randn(4, 1000, generator=torch.Generator().manual_seed(2)), dim=-1)
    a = draw(probs, torch.Generator().manual_seed(5))
    b = draw(probs, torch.Generator().manual_seed(5))
    assert torch.equal(a, b)
    g = torch.Generator().manual_seed(5)
    draw(probs, g)
    after = torch.rand(1, generator=g, dtype=torch.float64)
    expected = torch.Generator().manual_seed(5)
    torch.rand((4, 1), generator=expected, dtype=torch.float64)
    assert torch.equal(after, torch.rand(1, generator=expected, dtype=torch.float64))


def test_sample_next_reports_the_untruncated_logprob_of_the_draw():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        tok, lp = sample_next(logits, SamplingParams(top_p=0.7), g)
        assert int(tok) in (0, 1)
        assert float(lp) == pytest.approx(math.log([0.5, 0.3][int(tok)]), abs=1e-6)


def test_unique_rows_shares_identical_prompts_without_a_kept_prefix():
    prompts = [[1, 2], [3], [1, 2], [1, 2], [3]]
    kept = [None, None, None, "k", None]  # row 3 extends a kept prefix: pre-filled on its own
    src, inverse = unique_rows(prompts, kept)
    assert src == [0, 1, 3]
    assert inverse == [0, 1, 0, 2, 1]


def test_shared_prefill_gives_each_row_its_own_samples(model, tokenizer, renderer):
    """A group of identical prompts is pre-filled once: greedy continuations equal the prompt's own, the fp32
    log-probs equal an unshared pre-fill's to float rounding, and sampled rows still differ."""
    p = renderer.prompt_ids([{"role": "user", "content": "What is 12 * 34?"}])
    q = renderer.prompt_ids([{"role": "user", "content": "What is 1 + 2 + 3?"}])
    engine = TorchEngine(model, eos_ids=[tokenizer.eos_token_id], pad_id=tokenizer.pad_token_id)
    rows = []
    real = engine._prefill_rows
    engine._prefill_rows = lambda prompts, kept, room: rows.append(len(prompts)) or real(prompts, kept, room)
    greedy = SamplingParams(temperature=0.0)
    grouped = engine.generate([p, q, p, p], greedy, max_new_tokens=12)
    assert rows == [2]
    alone = [engine.generate([x], greedy, max_new_tokens=12)[0] for x in (p, q)]
    assert [g.token_ids for g in grouped] == [alone[i].token_ids for i in (0, 1, 0, 0)]
    for g, a in zip(grouped, [alone[i] for i in (0, 1, 0, 0)]):
        torch.testing.assert_close(torch.tensor(g.logprobs), torch.tensor(a.logprobs), atol=1e-5, rtol=0)
    sampled = engine.generate(
        [p] * 8, SamplingParams(), max_new_tokens=12, generator=torch.Generator().manual_seed(0)
    )
    assert len({tuple(g.token_ids) for g in sampled}) > 1
