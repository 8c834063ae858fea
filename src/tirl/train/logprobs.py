"""Per-token log-probs and entropy of a causal LM on given ids: the trainer's view of what the engine sampled."""

from __future__ import annotations

import torch

from tirl.algorithms import entropy_from_logits


def token_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p(x_t | x_<t) for t >= 1, aligned with input_ids (B, T); position 0 gets 0.

    Sequences are right-padded, so positions are 0..T-1 and padding only follows real tokens. `temperature` scales
    the logits exactly as the engine does before sampling. Entropy (B, T) is returned when asked for.
    """
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits  # (B, T, V)
    logits = logits[:, :-1].float()
    if temperature != 1.0:
        logits = logits / temperature
    lse = logits.logsumexp(dim=-1)  # (B, T-1); no second (B, T, V) tensor as log_softmax would make
    logp = logits.gather(-1, input_ids[:, 1:, None]).squeeze(-1) - lse  # (B, T-1)
    logp = torch.cat([logp.new_zeros(logp.shape[0], 1), logp], dim=1)  # (B, T)
    ent = None
    if with_entropy:
        ent = entropy_from_logits(logits)
        ent = torch.cat([ent.new_zeros(ent.shape[0], 1), ent], dim=1)
    return logp, ent
