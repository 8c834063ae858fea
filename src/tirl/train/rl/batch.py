"""From scored trajectories to what the RL trainer consumes: padded tensors, rollout log-probs, the groups that
carry a signal, the per-step rollout metrics, and sample text for the logs."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from tirl.algorithms import equal_reward_groups
from tirl.data.lengths import MAX_CHARS_PER_TOKEN, text_chars
from tirl.data.records import ProblemRow
from tirl.rollout.agent.toolstats import tool_stats
from tirl.rollout.types import Trajectory
from tirl.train import dist
from tirl.train.batch import TokenBatch, collate


def render_samples(trajs: Sequence[Trajectory], tokenizer: Any, k: int = 2) -> str:
    """The first `k` trajectories as text (prompt, response with tool output), headed by group and sample."""
    parts = []
    for t in trajs[:k]:
        text = tokenizer.decode(t.prompt_ids + t.response_ids, skip_special_tokens=False)
        parts.append(f"# group {t.group} sample {t.sample} stop={t.stop_reason}\n{text}")
    return "\n\n".join(parts)


TRUNCATED = ("budget", "turn_length", "error")  # stop reasons of a response cut off before it could answer


def groups_with_signal(
    trajs: Sequence[Trajectory], scores: Sequence[Any]
) -> tuple[list[Trajectory], list[Any]]:
    """The trajectories (and scores) of the groups whose rewards are not all equal, in their order."""
    if not trajs:
        return [], []
    groups = torch.tensor([t.group for t in trajs])
    equal = equal_reward_groups(torch.tensor([s.reward for s in scores]), groups)  # (num_groups,)
    ids = torch.unique(groups)  # sorted, as equal_reward_groups indexes them
    live = {int(g) for g, e in zip(ids.tolist(), equal.tolist(), strict=True) if not e}
    kept = [i for i, t in enumerate(trajs) if t.group in live]
    return [trajs[i] for i in kept], [scores[i] for i in kept]


def trajectory_batch(trajs: Sequence[Trajectory], advantages: torch.Tensor, *, pad_id: int) -> TokenBatch:
    """(B, T) tensors over prompt + response; the loss mask is 0 on the prompt, the trajectory's mask after it. The
    prompts' lengths come along (`prefix_len`): a group's rows may share its prompt's forward pass."""
    ids = [t.prompt_ids + t.response_ids for t in trajs]
    masks = [[0] * len(t.prompt_ids) + t.loss_mask for t in trajs]
    adv = [[float(a)] * len(x) for a, x in zip(advantages.tolist(), ids, strict=True)]
    batch = collate(ids, masks, pad_id=pad_id, extra={"advantages": adv})
    batch.prefix_len = torch.tensor([len(t.prompt_ids) for t in trajs], dtype=torch.long)
    return batch


def rollout_logprobs(trajs: Sequence[Trajectory], like: torch.Tensor) -> torch.Tensor:
    """(B, T) the engine's sampling log-probs aligned with `trajectory_batch` (0 on prompt, tool and padding)."""
    out = torch.zeros(like.shape, dtype=torch.float32)
    for b, t in enumerate(trajs):
        p = len(t.prompt_ids)
        out[b, p : p + len(t.logprobs)] = torch.tensor(t.logprobs, dtype=torch.float32)
    return out.to(like.device)


@dataclass(frozen=True)
class RolloutStats:
    """What the per-step rollout metrics read from one trajectory: a few numbers, cheap to gather from every rank
    (a trajectory's token lists are not)."""

    stop_reason: str
    num_tool_calls: int
    num_tool_errors: int
    turns: int
    response_tokens: int  # the response's length, tool-output tokens included
    sampled_tokens: int
    surprisal: float = 0.0  # -sum of the sampled tokens' sampling log-probs

    @classmethod
    def of(cls, t: Trajectory) -> RolloutStats:
        surprisal = -sum(lp for lp, m in zip(t.logprobs, t.loss_mask, strict=True) if m)
        return cls(
            t.stop_reason,
            t.num_tool_calls,
            t.num_tool_errors,
            t.turns,
            t.response_length,
            sum(t.loss_mask),
            surprisal,
        )


def rollout_metrics(
    trajs: Sequence[Trajectory | RolloutStats], rewards: Sequence[float], correct: Sequence[bool]
) -> dict[str, float]:
    """`rollout/entropy` is the mean surprisal -log p of the sampled tokens under the sampling distribution: a
    Monte Carlo estimate of the policy's per-token entropy at the sampling temperature (E[-log p(x)] = H), free
    where an exact one would need the full distribution at every token (verl's `actor/entropy`; tirl computes that
    only for an entropy bonus, `loss/entropy`)."""
    trajs = [t if isinstance(t, RolloutStats) else RolloutStats.of(t) for t in trajs]
    n = max(1, len(trajs))
    stops = Counter(t.stop_reason for t in trajs)
    sampled = sum(t.sampled_tokens for t in trajs)
    out = {
        "reward/mean": sum(rewards) / n,
        "reward/accuracy": sum(correct) / n,
        "rollout/sampled_tokens": sampled / n,
        "rollout/entropy": sum(t.surprisal for t in trajs) / max(1, sampled),
    }
    for reason in ("answer", "budget", "max_turns", "turn_length"):
        out[f"rollout/stop_{reason}"] = stops.get(reason, 0) / n
    # the names and numbers of eval summaries and `tirl analyze`, overall and split by correct / incorrect
    tools = tool_stats(trajs, correct)
    out.update({f"rollout/{k}": v for k, v in tools.items() if not k.endswith("responses")})
    return out


def global_rollout_metrics(
    trajs: Sequence[Trajectory],
    scores: Sequence[Any],
    rewards: torch.Tensor,
    groups: torch.Tensor,
    adv: torch.Tensor,
) -> tuple[dict[str, float], list[RolloutStats]]:
    """The step's rollout and advantage metrics over every rank's trajectories (the same numbers on every rank),
    and the gathered per-trajectory numbers. rewards, groups, adv: (B,) of this rank."""
    parts = dist.all_gather_objects(
        ([RolloutStats.of(t) for t in trajs], rewards, groups, adv, [s.correct for s in scores])
    )
    stats = [x for p in parts for x in p[0]]
    all_rewards, all_groups, all_adv = (torch.cat([p[i] for p in parts]) for i in (1, 2, 3))
    out = rollout_metrics(stats, all_rewards.tolist(), [c for p in parts for c in p[4]])
    equal = equal_reward_groups(all_rewards, all_groups)  # (num_groups,)
    out["adv/zero_share"] = float(equal.float().mean())
    # the groups that teach something (rewards not all equal): what the run's curves plot
    out["adv/signal_share"] = float((~equal).float().mean())
    out["adv/mean_abs"] = float(all_adv.abs().mean())
    out["rollout/truncated"] = sum(s.stop_reason in TRUNCATED for s in stats) / max(1, len(stats))
    return out, stats


def fitting_prompts(rows: Sequence[ProblemRow], renderer: Any, max_tokens: int) -> list[ProblemRow]:
    """The rows whose rendered prompt has at most `max_tokens` tokens (0 = all), as verl's filter_overlong_prompts
    drops the others before training; a console line says how many went, and none left is an error."""
    if not max_tokens:
        return list(rows)
    # characters: a prompt with more cannot fit, and is dropped before it is tokenized (tirl.data.lengths)
    most = max_tokens * MAX_CHARS_PER_TOKEN

    def fits(r: ProblemRow) -> bool:
        return text_chars(r.prompt, most) <= most and len(renderer.prompt_ids(r.prompt)) <= max_tokens

    kept = [r for r in rows if fits(r)]
    if not kept:
        raise ValueError(f"every RL prompt is longer than agent.max_prompt_tokens={max_tokens}")
    if len(kept) < len(rows):
        from tirl.core.logging import console

        console.print(
            f"dropped {len(rows) - len(kept)} of {len(rows)} RL prompts over agent.max_prompt_tokens={max_tokens}"
        )
    return kept


def rank_reduced(values: dict[str, float]) -> dict[str, float]:
    """Per-rank metrics over all ranks: a `_max` key is the largest rank's (every rank's mismatch stays visible),
    every other key the mean over ranks; the values themselves in one process."""
    if dist.world_size() == 1:
        return dict(values)
    parts = dist.all_gather_objects(values)
    keys = sorted(set().union(*parts))
    return {
        k: max(p.get(k, 0.0) for p in parts)
        if k.endswith("_max")
        else sum(p.get(k, 0.0) for p in parts) / len(parts)
        for k in keys
    }
