"""Sampling parameters and the next-token sampler: a pure tensor function, shared by every torch engine."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass
class SamplingParams:
    """temperature 0 means greedy; top_k <= 0 and top_p >= 1 mean no truncation."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_new_tokens: int = 256

    @property
    def logprob_temperature(self) -> float:
        """The temperature log-probs are taken at: the sampling one, or 1 when greedy."""
        return self.temperature if self.temperature > 0 else 1.0

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")


def per_prompt_budgets(
    n: int, params: SamplingParams, max_new_tokens: Sequence[int] | int | None
) -> list[int]:
    """Every engine's `generate(max_new_tokens=...)`: None (params.max_new_tokens), one int, or one per prompt."""
    if max_new_tokens is None or isinstance(max_new_tokens, int):
        return [params.max_new_tokens if max_new_tokens is None else max_new_tokens] * n
    budgets = list(max_new_tokens)
    if len(budgets) != n:
        raise ValueError(f"max_new_tokens has {len(budgets)} entries for {n} prompts")
    return budgets


DRAW_BLOCK = 2048  # entries per block of `draw_blocks`' first level
TOP_P_CANDIDATES = 1024  # the K largest entries top-p decides within before it sorts a whole row
SUM_CHUNK_BYTES = 2**21  # a CPU's float64 block sums convert this much of the rows at a time
TOP_P_SLACK = 1e-6  # the candidates' mass passes top_p by this (float32 rounding): the rest is dropped


def uniforms(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One float64 uniform per row of `probs` (B, 1), from `generator` on its own device, on `probs`' device: a
    CPU generator drives a GPU model (the uniforms uploaded from pinned memory, so the upload waits for nothing)."""
    dev = generator.device if generator is not None else probs.device
    u = torch.rand((probs.shape[0], 1), generator=generator, dtype=torch.float64, device=dev)
    if u.device.type == "cpu" and probs.device.type == "cuda":
        u = u.pin_memory()
    return u.to(probs.device, non_blocking=True)


def draw(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One index per row of `probs` (B, V), each drawn with probability proportional to its entry (rows need not
    sum to 1): inverse-CDF sampling, one uniform per row (`uniforms`) against the row's cumulative sums.

    `torch.multinomial` draws one exponential variate per vocabulary entry (the exponential-race trick): 49,152 per
    row for SmolLM2, 12 ms of a 100 ms decode step at batch 16 on 2 cores. A cumulative sum costs one pass and one
    random number a row. The sums are float64, so the mass a token gets is exact to ~1e-16 of the row's total
    (float32 sums over 150k entries would misplace ~1e-5 of it). Entries of zero (truncated by top-k/top-p) are
    never drawn. The scan runs in two levels (`draw_blocks`): on CUDA a cumulative sum along a long last dimension
    with few rows runs each row serially (pytorch/pytorch#122170); on a 2-core CPU the two levels were 5-11 times
    faster at batch 64 and 0.6-4.6 times as fast at batch 16 (bench/results/sampler.json).
    """
    return draw_blocks(probs, uniforms(probs, generator))


def draw_blocks(probs: torch.Tensor, u: torch.Tensor, block: int = DRAW_BLOCK) -> torch.Tensor:
    """`draw` given its uniforms `u` (B, 1): the row's blocks of `block` entries summed (float64), the block holding
    u x total found in the short cumulative sum of those, then the token within it by that block's own cumulative
    sum. The token is the one a single cumulative sum over the row finds, except where u x total lies within float64
    rounding of a boundary. Empty blocks and zero entries are never chosen: a search for the first cumulative sum
    above the target skips what adds nothing, and a target past the end (rounding) takes the last nonzero entry."""
    B, V = probs.shape
    block = min(block, V)
    csum = block_sums(probs, block).cumsum(-1)  # (B, nb)
    target = u * csum[:, -1:]
    last = torch.searchsorted(csum, csum[:, -1:].contiguous())  # the first block reaching the total: nonempty
    blk = torch.minimum(torch.searchsorted(csum, target, right=True), last)  # (B, 1)
    before = torch.where(blk > 0, csum.gather(1, (blk - 1).clamp(min=0)), 0.0)
    cols = blk * block + torch.arange(block, device=probs.device)  # (B, block)
    local = probs.gather(1, cols.clamp(max=V - 1)).to(torch.float64).masked_fill(cols >= V, 0.0).cumsum(-1)
    j = torch.minimum(
        torch.searchsorted(local, target - before, right=True),  # first entry with local > the rest of target
        torch.searchsorted(local, local[:, -1:].contiguous()),  # the block's last nonzero entry
    )
    return (blk * block + j).squeeze(-1)


def block_sums(probs: torch.Tensor, block: int) -> torch.Tensor:
    """The float64 sums (B, ceil(V / block)) of each row's blocks of `block` entries, the last one shorter where
    `block` does not divide V. A CPU sums a few rows at a time: a float32 sum to float64 converts its input first,
    and a copy of 64 x 151,936 doubles (78 MB) would come from fresh pages at each call, slower than the sum."""
    B, V = probs.shape
    full = V - V % block
    chunk = B if probs.device.type != "cpu" else max(1, SUM_CHUNK_BYTES // (8 * V))
    parts = []
    for rows in probs.split(chunk):  # (b, V)
        sums = rows[:, :full].reshape(len(rows), -1, block).sum(-1, dtype=torch.float64)
        if full < V:  # the tail, a shorter block
            sums = torch.cat([sums, rows[:, full:].sum(-1, keepdim=True, dtype=torch.float64)], dim=1)
        parts.append(sums)
    return torch.cat(parts) if len(parts) > 1 else parts[0]


def top_p_probs(filtered: torch.Tensor, top_p: float, candidates: int | None = None) -> torch.Tensor:
    """exp(`filtered`) (B, V) with zeros outside each row's top-p set: the smallest set of highest-probability
    tokens whose mass reaches `top_p` (a token is dropped where the mass before it already does).

    The set is decided among the `candidates` largest entries (`torch.topk`, default TOP_P_CANDIDATES) wherever
    their mass passes top_p (nearly every real distribution); only the other rows sort their whole row (a sort of
    64 x 151,936 is the sampler's costliest op: bench/sampler.py) and keep what a full sort always kept. The rule
    is the sort's, but the candidates' probabilities are normalized by the sum of the unsorted row where the sort
    normalized the sorted one: a token whose preceding mass lies within float32 rounding of top_p may fall on the
    other side, and tokens of equal probability at the boundary may be ordered, so kept, differently by topk and
    sort. Whether any row falls back is one boolean read to the host (on a GPU, a wait for the step's logits).
    """
    probs = filtered.exp()  # (B, V)
    k = min(TOP_P_CANDIDATES if candidates is None else candidates, probs.shape[-1])
    vals, idx = torch.topk(probs, k, dim=-1)  # (B, k), largest first
    p = vals / probs.sum(-1, keepdim=True)  # top-k's survivors renormalized
    cum = p.cumsum(dim=-1)
    kept = vals.masked_fill(cum - p >= top_p, 0.0)
    short = cum[:, -1] < top_p + TOP_P_SLACK  # (B,): tokens past the candidates might be kept
    rows = short.nonzero().squeeze(1) if k < probs.shape[-1] and bool(short.any()) else None
    if rows is not None:
        whole = probs[rows].masked_fill(~sorted_top_p(filtered[rows], top_p), 0.0)
    probs.zero_().scatter_(-1, idx, kept)
    if rows is not None:
        probs[rows] = whole
    return probs


def sorted_top_p(filtered: torch.Tensor, top_p: float) -> torch.Tensor:
    """The top-p set of each row of `filtered` (B, V) as a mask, by a full sort: drop a token where the mass before
    it reaches top_p."""
    sorted_lp, sorted_idx = torch.sort(filtered, dim=-1, descending=True)
    p = sorted_lp.softmax(dim=-1)
    drop = p.cumsum(dim=-1) - p >= top_p
    return torch.empty_like(drop).scatter_(-1, sorted_idx, ~drop)


def sample_next(
    logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row of `logits` (B, V); return ids (B,) and their log-probs (B,).

    The log-prob is taken under softmax(logits / T) before top-k/top-p truncation (T = 1 when greedy), which is
    what the trainer recomputes from the same ids. Sampling is `draw` over the (truncated) probabilities: top-k
    first, then top-p (`top_p_probs`) over what top-k keeps.
    """
    t = params.logprob_temperature
    logp = torch.log_softmax(logits.float() / t if t != 1.0 else logits.float(), dim=-1)  # (B, V); x / 1 is x
    if params.temperature == 0:
        tok = logp.argmax(dim=-1)
    else:
        filtered = logp
        if params.top_k > 0 and params.top_k < logp.shape[-1]:
            kth = torch.topk(filtered, params.top_k, dim=-1).values[:, -1:]
            filtered = filtered.masked_fill(filtered < kth, float("-inf"))
        probs = filtered.exp() if params.top_p >= 1.0 else top_p_probs(filtered, params.top_p)
        tok = draw(probs, generator)  # exp(-inf) = 0: truncated tokens are never drawn
    return tok, logp.gather(-1, tok[:, None]).squeeze(-1)
