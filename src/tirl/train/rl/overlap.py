"""One-step off-policy RL (`rl.off_policy_steps: 1`): the next step's rollouts are sampled while this step updates.

verl's one-step-off-policy recipe, AReaL and prime-rl overlap generation with training this way. Step k:
1. take batch k (sampled during step k-1's update; step 0 samples its own first, as the synchronous loop does);
2. start sampling batch k+1 in a background thread, from the weights the engine serves now (step k's);
3. update the policy on batch k;
4. wait for batch k+1, then sync the new weights: an engine never reloads under a batch's requests.
Every batch after the first is therefore exactly one update stale; `rollout/staleness` logs it (the engine's weight
version minus the version that sampled each trained token, averaged: 1.0; `staleness_metrics`). The old log-probs are recomputed
with the current policy, so the engine/trainer correction (`rl.correction.mode`, token TIS by default for a
server engine) covers the staleness too, and `rollout/logprob_diff_*` include it.

Resume: batch k+1 is complete before step k's checkpoint is written (it is waited for before the sync), so the
checkpoint includes it (each rank's own, `pending`) and a resumed run trains on that very batch.

Determinism: the background job's prompts and its generator's seed are drawn in the main thread, in step order,
before it starts; the job reads nothing the update writes.

Not for an engine that samples from the trainer's own module (the torch engine): the update changes that module
under the sampler's feet, so the trainer refuses `off_policy_steps: 1` with it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from tirl.rollout.types import Trajectory

OFF_POLICY_STEPS = (0, 1)


class Lookahead:
    """The one batch sampled ahead: `start(job)` runs `job` in a background thread, `wait()` keeps its result as
    `pending` (re-raising its error), `take()` hands `pending` over once."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tirl-lookahead")
        self._future: Future | None = None
        self.pending: Any = None

    def start(self, job: Callable[[], Any]) -> None:
        if self._future is not None or self.pending is not None:
            raise RuntimeError("a batch is already sampled ahead: take it before starting the next")
        self._future = self._pool.submit(job)

    def wait(self) -> None:
        if self._future is not None:
            future, self._future = self._future, None
            self.pending = future.result()

    def take(self) -> Any:
        self.wait()
        out, self.pending = self.pending, None
        return out

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


def staleness(trajs: Sequence[Trajectory], engine_version: int) -> float:
    """Updates between the weights that sampled each trained token and the engine's now, averaged over tokens."""
    return staleness_metrics(trajs, engine_version)["rollout/staleness"]


def token_ages(trajs: Sequence[Trajectory], engine_version: int) -> Counter[int]:
    """Sampled tokens by age (the engine's version minus the version that sampled them); a trajectory without
    per-token versions counts its turns' (`Trajectory.turn_token_versions`)."""
    ages: Counter[int] = Counter()
    for t in trajs:
        versions = t.token_versions or t.turn_token_versions() or []
        ages.update(engine_version - v for v, m in zip(versions, t.loss_mask, strict=False) if m)
    return ages


def staleness_metrics(trajs: Sequence[Trajectory], engine_version: int) -> dict[str, float]:
    """`rollout/staleness` as a distribution over the sampled tokens: its mean, its max (`_max`: the largest over
    ranks) and the share of tokens `k` updates old (`rollout/staleness_share/k`, k from 0 to the max)."""
    ages = token_ages(trajs, engine_version)
    total = sum(ages.values())
    if not total:
        return {"rollout/staleness": 0.0, "rollout/staleness_max": 0.0}
    out = {
        "rollout/staleness": sum(a * c for a, c in ages.items()) / total,
        "rollout/staleness_max": float(max(ages)),
    }
    out.update({f"rollout/staleness_share/{a}": ages.get(a, 0) / total for a in range(max(ages) + 1)})
    return out


def check_off_policy(steps: int, *, dynamic_sampling: bool) -> None:
    """`rl.off_policy_steps` and what it cannot be combined with, checked in `RLConfig.__post_init__`."""
    if steps not in OFF_POLICY_STEPS:
        raise ValueError(f"rl.off_policy_steps={steps}; valid: 0 (synchronous) or 1 (one step ahead)")
    if steps and dynamic_sampling:
        raise ValueError(
            "rl.off_policy_steps=1 with rl.dynamic_sampling: refilling rounds draw prompts while the update runs; "
            "use one of them"
        )
