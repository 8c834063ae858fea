"""The next-token sampler (tirl.rollout.sampling) against its earlier form, on a CPU: one float64 cumulative sum over
the whole row for the draw and a full sort of the row for top-p (kept here as the baseline), against the two-level
draw (block sums, then one block's cumulative sum) and top-p decided within `torch.topk` of TOP_P_CANDIDATES.

Cases: vocabularies of 49,152 (SmolLM2) and 151,936 (Qwen), batches 16 and 64, top_p 1 and 0.95, temperature 1, on
logits drawn as Gaussians of standard deviation LOGIT_STD (the top 1,024 tokens then hold nearly all of the mass,
as a language model's do); one more case with flat logits (standard deviation 1), where every row's top 1,024 fall
short of top_p and the new path sorts the row after its topk: its worst case. Each case reports the median of
REPS calls of `sample_next` (and of `draw` alone) for both, in milliseconds, the speed-up, how many rows fell back
to the sort, and whether the two drew the same tokens from the same seed. torch.set_num_threads(2).
Writes bench/results/sampler.json, or `--out`.

Where the new path is not faster (bench/results/sampler.json, one run on a 2-core CPU): `draw` alone at 49,152
tokens and batch 16 in one of its two measurements (1.2 against 0.7 ms; 1.1 against 5.2 in the other, and
`sample_next` faster in both), and the flat case, which sorts every row as before, after a topk (no gain to
expect). `draw` stays two-level on every device: 5-11 times as fast at batch 64.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

from bench.common import cli as common_cli
from tirl.rollout.sampling import TOP_P_CANDIDATES, TOP_P_SLACK, SamplingParams, draw, sample_next, uniforms

CASES = [(v, b, p, "gaussian") for v in (49_152, 151_936) for b in (16, 64) for p in (1.0, 0.95)]
CASES.append((151_936, 64, 0.95, "flat"))
LOGIT_STD = {"gaussian": 5.0, "flat": 1.0}
REPS = 7


def old_draw(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """The baseline draw: one float64 cumulative sum over each whole row, one uniform per row."""
    cdf = torch.cumsum(probs, dim=-1, dtype=torch.float64)  # (B, V)
    u = uniforms(probs, generator)  # as the engine's draw takes them: bench/gpu.py runs this on CUDA too
    tok = torch.searchsorted(cdf, u * cdf[:, -1:], right=True)
    return tok.squeeze(-1).clamp_(max=probs.shape[-1] - 1)


def old_sample_next(
    logits: torch.Tensor, params: SamplingParams, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """The baseline sampler: top-p by a full sort of each row, then `old_draw` (top-k left out: not timed)."""
    logp = torch.log_softmax(logits.float() / params.logprob_temperature, dim=-1)  # (B, V)
    filtered = logp
    if params.top_p < 1.0:
        sorted_lp, sorted_idx = torch.sort(filtered, dim=-1, descending=True)
        cum = sorted_lp.softmax(dim=-1).cumsum(dim=-1)
        drop = cum - sorted_lp.softmax(dim=-1) >= params.top_p
        sorted_lp = sorted_lp.masked_fill(drop, float("-inf"))
        filtered = torch.full_like(filtered, float("-inf")).scatter(-1, sorted_idx, sorted_lp)
    tok = old_draw(filtered.exp(), generator)
    return tok, logp.gather(-1, tok[:, None]).squeeze(-1)


def median_ms(fn: Callable[[], object]) -> float:
    """The median of REPS timed calls after one warm-up, in milliseconds."""
    fn()
    times = []
    for _ in range(REPS):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def case(vocab: int, batch: int, top_p: float, logits_kind: str) -> dict:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(batch, vocab, generator=gen) * LOGIT_STD[logits_kind]
    params = SamplingParams(temperature=1.0, top_p=top_p)
    probs = torch.softmax(logits, dim=-1)
    mass = torch.topk(probs, min(TOP_P_CANDIDATES, vocab), dim=-1).values.sum(-1)  # (B,)
    same = torch.equal(
        old_sample_next(logits, params, torch.Generator().manual_seed(1))[0],
        sample_next(logits, params, torch.Generator().manual_seed(1))[0],
    )
    g = torch.Generator().manual_seed(2)
    ms = {
        "old_sample_next": median_ms(lambda: old_sample_next(logits, params, g)),
        "new_sample_next": median_ms(lambda: sample_next(logits, params, g)),
        "old_draw": median_ms(lambda: old_draw(probs, g)),
        "new_draw": median_ms(lambda: draw(probs, g)),
    }
    return {
        "vocab": vocab,
        "batch": batch,
        "top_p": top_p,
        "logits": f"{logits_kind} (std {LOGIT_STD[logits_kind]})",
        "ms": ms,
        "speedup_sample_next": ms["old_sample_next"] / ms["new_sample_next"],
        "speedup_draw": ms["old_draw"] / ms["new_draw"],
        "rows_sorted": int((mass < top_p + TOP_P_SLACK).sum()) if top_p < 1 else 0,
        "same_tokens_as_old": same,
    }


def main() -> dict:
    torch.set_num_threads(2)
    res: dict = {"torch_threads": 2, "reps": REPS, "top_p_candidates": TOP_P_CANDIDATES, "cases": []}
    for vocab, batch, top_p, kind in CASES:
        row = case(vocab, batch, top_p, kind)
        res["cases"].append(row)
        ms = row["ms"]
        print(
            f"V={vocab} B={batch} top_p={top_p} {kind}: sample_next {ms['old_sample_next']:.1f} -> "
            f"{ms['new_sample_next']:.1f} ms, draw {ms['old_draw']:.1f} -> {ms['new_draw']:.1f} ms, "
            f"{row['rows_sorted']} rows sorted, same tokens {row['same_tokens_as_old']}",
            flush=True,
        )
    return res


def cli(argv: list[str] | None = None) -> None:
    common_cli("sampler", __doc__, lambda args: main(), argv, shown=None)


if __name__ == "__main__":
    cli()
