"""Token fidelity of every RL step, on by default: what the trainer is about to train on is what was sampled.

Each trajectory is re-rendered from its prompt, its sampled turns' text and its tool responses
(`tirl.chat.tokcheck.check_rollout`): template tokens (prompt, tool turns, headers) must equal the re-render and
carry mask 0, each sampled turn must decode to its text and carry mask 1. A disagreement is a bug in the token
stream, so the step stops with a `TirlError` naming the trajectory (its row in the step, problem and sample) and
the first divergence. The number logged, `rollout/retokenized_turn_share`, is the share of sampled turns whose
ids differ from the tokenizer's own encoding of the same text: a valid sample, but what a trainer that
re-tokenizes text would silently train on instead (tirl trains on the sampled ids).
Deliberately not here: the comparison itself (`tirl.chat.tokcheck`) and files (`tirl check-tokens`).
"""

from __future__ import annotations

from collections.abc import Sequence

from tirl.chat.template import ChatRenderer
from tirl.chat.tokcheck import check_rollout
from tirl.core.errors import TirlError
from tirl.rollout.types import Trajectory
from tirl.train import dist


def token_fidelity(trajs: Sequence[Trajectory], renderer: ChatRenderer, stream: str) -> dict[str, float]:
    """`rollout/retokenized_turn_share` over every rank's sampled turns; raises naming the first trajectory whose
    ids or loss mask disagree with their re-render. `stream`: agent.token_stream."""
    retokenized = turns = 0
    for k, t in enumerate(trajs):
        if t.problem is None:  # no prompt messages to re-render from (a trajectory built by hand)
            continue
        d, drift = check_rollout(renderer, k + 1, t.problem.prompt, t.to_dict(), stream=stream)
        if d is not None:
            raise TirlError(
                f"RL trajectory {k + 1} of this step (problem {t.problem.problem_id}, sample {t.sample}) does not "
                f"re-render to its ids and loss mask: {d.describe()}"
            )
        retokenized += drift
        turns += len(t.turn_texts)
    total = dist.sum_floats({"retokenized": float(retokenized), "turns": float(turns)})
    return {"rollout/retokenized_turn_share": total["retokenized"] / max(1.0, total["turns"])}
