"""The sampler without a full-row scan or sort: the two-level draw against one cumulative sum over the row, and top-p
decided among the largest entries against a full sort, each checked against a small reference kept here."""

import pytest
import torch

from tirl.rollout import sampling
from tirl.rollout.sampling import SamplingParams, draw, draw_blocks, sample_next, top_p_probs


def reference_draw(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One float64 cumulative sum over the whole row, one uniform per row (the sampler's earlier draw)."""
    cdf = torch.cumsum(probs, dim=-1, dtype=torch.float64)
    u = torch.rand((probs.shape[0], 1), generator=generator, dtype=torch.float64, device=generator.device)
    tok = torch.searchsorted(cdf, u.to(probs.device) * cdf[:, -1:], right=True)
    return tok.squeeze(-1).clamp_(max=probs.shape[-1] - 1)


def reference_top_p(filtered: torch.Tensor, top_p: float) -> torch.Tensor:
    """The kept mask of a full sort (the sampler's earlier top-p): drop a token where the mass before it reaches
    top_p."""
    sorted_lp, sorted_idx = torch.sort(filtered, dim=-1, descending=True)
    p = sorted_lp.softmax(dim=-1)
    drop = p.cumsum(dim=-1) - p >= top_p
    return torch.zeros_like(drop).scatter(-1, sorted_idx, ~drop)


def reference_sample_next(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator):
    logp = torch.log_softmax(logits.float() / params.logprob_temperature, dim=-1)
    if params.temperature == 0:
        tok = logp.argmax(dim=-1)
    else:
        filtered = logp
        if 0 < params.top_k < logp.shape[-1]:
            kth = torch.topk(filtered, params.top_k, dim=-1).values[:, -1:]
            filtered = filtered.masked_fill(filtered < kth, float("-inf"))
        if params.top_p < 1.0:
            filtered = filtered.masked_fill(~reference_top_p(filtered, params.top_p), float("-inf"))
        tok = reference_draw(filtered.exp(), generator)
    return tok, logp.gather(-1, tok[:, None]).squeeze(-1)


def random_rows(b: int, v: int, seed: int) -> torch.Tensor:
    """Rows of every shape the sampler meets: peaked and flat, truncated below a random k-th largest entry, with
    runs of zeros, and rows with one live entry (first, last, or in the last block)."""
    g = torch.Generator().manual_seed(seed)
    scale = torch.tensor([0.3, 2.0, 6.0, 12.0])[torch.arange(b) % 4][:, None]
    probs = torch.softmax(torch.randn(b, v, generator=g) * scale, dim=-1)
    for r in range(0, b, 3):  # a third truncated below a random k-th largest entry
        k = int(torch.randint(1, v + 1, (1,), generator=g))
        probs[r] = probs[r].masked_fill(probs[r] < probs[r].topk(k).values[-1], 0)
    for r in range(0, b, 7):  # a run of zeros a few blocks long
        start = int(torch.randint(0, v, (1,), generator=g))
        probs[r, start : start + min(5000, v // 2)] = 0
    probs[1, :] = 0
    probs[1, -1] = 1.0  # only the last entry
    probs[2, :] = 0
    probs[2, 0] = 0.5  # only the first
    probs[3, : max(1, v - 3)] = 0
    probs[3, -1] = 1e-3  # only the last three, at least the last one live
    probs[4, 0] = 1.0  # one entry far above the rest
    probs[probs.sum(-1) == 0, -1] = 1.0  # a row the zeros emptied (small V): no sampler meets one
    return probs


@pytest.mark.parametrize("v", [7, 1000, 1024, 1025, 151_936])
def test_two_level_draw_equals_one_cumulative_sum(v):
    """10,000 draws (2,048 at Qwen's vocabulary, to keep the test short): the same index as one cumulative sum over
    the row from the same seed, at the default block and at a small one (many blocks, a short tail), and never a
    zero entry."""
    rows, calls = (16, 128) if v > 10_000 else (200, 50)
    probs = random_rows(rows, v, seed=v)
    for block in (sampling.DRAW_BLOCK, 64):
        ref, new = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
        for _ in range(calls if block == sampling.DRAW_BLOCK else 20):
            want = reference_draw(probs, ref)
            got = draw_blocks(probs, sampling.uniforms(probs, new), block)
            assert torch.equal(got, want)
            assert (probs.gather(1, got[:, None]) > 0).all()
    a, b = torch.Generator().manual_seed(4), torch.Generator().manual_seed(4)
    assert torch.equal(draw(probs, a), reference_draw(probs, b))  # draw is the two-level path
    assert torch.equal(torch.rand(3, generator=a), torch.rand(3, generator=b))  # one uniform per row


@pytest.mark.parametrize("block", [1, 2, 3, 4, 2048])
def test_draw_never_takes_a_zero_entry_at_the_ends_of_the_uniform(block):
    """Uniforms of 0, just under 1 and 1 itself (past the end, as rounding could put u x total): always a live
    entry, also where whole blocks, the first or the last block, are empty."""
    v = 11
    rows = torch.zeros(6, v)
    rows[0, 5] = 1.0  # one entry mid-row
    rows[1, 0], rows[1, 10] = 1e-30, 2.0  # the first (tiny) and the last
    rows[2, 0] = 3.0  # only the first: every later block empty
    rows[3, 10] = 1.0  # only the last: the tail block
    rows[4, 3], rows[4, 7] = 1.0, 0.5  # two entries, in different blocks at block 4
    rows[5] = (torch.arange(v) % 4 == 1).float()  # every fourth
    for u in (0.0, 1.0 - 2.0**-53, 1.0):
        tok = draw_blocks(rows, torch.full((6, 1), u, dtype=torch.float64), block)
        assert (rows.gather(1, tok[:, None]) > 0).all(), (u, tok)
    last = draw_blocks(rows, torch.ones(6, 1, dtype=torch.float64), block)
    assert last.tolist() == [5, 10, 0, 10, 7, 9]  # past the end: the last live entry


def test_draw_frequencies_are_exact_on_a_grid_of_uniforms():
    """Uniforms on an even grid of N points: each token gets its probability's share of them, to one point at
    each of its two boundaries, through many small blocks and an empty one."""
    p = torch.tensor([[0.1, 0.0, 0.0, 0.25, 0.05, 0.0, 0.3, 0.0, 0.0, 0.2, 0.1]], dtype=torch.float64)
    n = 100_000
    u = (torch.arange(n, dtype=torch.float64)[:, None] + 0.5) / n
    for block in (2, 3, 4, 11):
        counts = torch.bincount(draw_blocks(p.expand(n, -1), u, block), minlength=11).double()
        assert ((counts - n * p[0]).abs() <= 1).all(), (block, counts)
        assert counts[p[0] == 0].sum() == 0


@pytest.mark.parametrize("candidates", [4, 64, 1024])
def test_top_p_keeps_the_full_sorts_set(monkeypatch, candidates):
    """On random logits (peaked rows decided among the candidates, flat ones falling back to the sort), the kept
    set is the full sort's, and only the rows whose candidates fall short of top_p are sorted."""
    g = torch.Generator().manual_seed(5)
    scale = torch.tensor([0.05, 0.5, 3.0, 8.0])[torch.arange(64) % 4][:, None]
    logp = torch.log_softmax(torch.randn(64, 3000, generator=g) * scale, dim=-1)
    sorted_rows: list[int] = []
    real_sort = torch.sort
    monkeypatch.setattr(torch, "sort", lambda x, *a, **k: sorted_rows.append(len(x)) or real_sort(x, *a, **k))
    p = logp.exp()
    mass = (p.topk(candidates, dim=-1).values / p.sum(-1, keepdim=True)).cumsum(-1)[:, -1]  # (B,)
    for top_p in (0.3, 0.9, 0.95, 0.99):
        sorted_rows.clear()
        kept = top_p_probs(logp, top_p, candidates) > 0
        monkeypatch.undo()  # the reference's own sort is not counted
        assert torch.equal(kept, reference_top_p(logp, top_p)), top_p
        monkeypatch.setattr(
            torch, "sort", lambda x, *a, **k: sorted_rows.append(len(x)) or real_sort(x, *a, **k)
        )
        assert sum(sorted_rows) == int((mass < top_p + sampling.TOP_P_SLACK).sum())


def test_top_p_falls_back_on_a_near_flat_distribution():
    """top_p 0.99 over a near-flat row: 16 candidates hold ~1% of the mass, so the row is sorted whole."""
    logp = torch.log_softmax(torch.randn(3, 5000, generator=torch.Generator().manual_seed(6)) * 0.01, dim=-1)
    kept = top_p_probs(logp, 0.99, candidates=16) > 0
    assert torch.equal(kept, reference_top_p(logp, 0.99))
    assert (kept.sum(-1) > 4900).all()


@pytest.mark.parametrize("top_k", [-1, 1, 40])
@pytest.mark.parametrize("top_p", [1.0, 0.9, 0.99])
def test_sample_next_draws_the_earlier_samplers_tokens(monkeypatch, top_k, top_p):
    """The same tokens and log-probs as the sampler's earlier form (full cumulative sum, full sort) from the same
    seed, top-k composed with top-p, some rows falling back (few candidates); greedy unchanged."""
    monkeypatch.setattr(sampling, "TOP_P_CANDIDATES", 32)
    g = torch.Generator().manual_seed(7)
    logits = torch.randn(48, 4099, generator=g) * torch.tensor([0.2, 1.0, 4.0])[torch.arange(48) % 3][:, None]
    for temperature in (0.0, 0.7, 1.0):
        params = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k)
        a, b = torch.Generator().manual_seed(8), torch.Generator().manual_seed(8)
        for _ in range(5):
            want_tok, want_lp = reference_sample_next(logits, params, a)
            tok, lp = sample_next(logits, params, b)
            assert torch.equal(tok, want_tok)
            assert torch.equal(lp, want_lp)


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.gpu
@CUDA
def test_cuda_sampler_draws_the_cpu_tokens():
    """On CUDA with a CPU generator: the CPU's tokens, at Qwen's vocabulary and batch 64, with and without top-p."""
    logits = torch.randn(64, 151_936, generator=torch.Generator().manual_seed(9)) * 4
    for params in (SamplingParams(), SamplingParams(top_p=0.95), SamplingParams(top_p=0.9, top_k=50)):
        a, b = torch.Generator().manual_seed(10), torch.Generator().manual_seed(10)
        for _ in range(3):
            cpu_tok, cpu_lp = sample_next(logits, params, a)
            cuda_tok, cuda_lp = sample_next(logits.cuda(), params, b)
            assert torch.equal(cuda_tok.cpu(), cpu_tok)
            torch.testing.assert_close(cuda_lp.cpu(), cpu_lp, atol=1e-5, rtol=0)
    probs = random_rows(64, 151_936, seed=11)
    a, b = torch.Generator().manual_seed(12), torch.Generator().manual_seed(12)
    assert torch.equal(draw(probs.cuda(), b).cpu(), draw(probs, a))
