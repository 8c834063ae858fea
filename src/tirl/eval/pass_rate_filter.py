"""Keep the problems whose pass rate under a model lies in a band, as RL rows for `tirl rl`.

GRPO learns nothing from a group whose rewards are all equal, so a problem the policy never or always solves spends
a step's rollouts on no signal. `tirl data filter` (`tirl.commands.filter`) samples k answers per problem with the
model exactly as `tirl data sample` does (the same config, engine, sandbox and verifier, through
`sampled_groups`), at the RL sampling settings (`rollout.temperature`, `rollout.top_p`, `rollout.top_k`: the pass
rate RL will see), counts the samples the verifier grades correct, and keeps the problems whose rate correct / k
lies in the band. The band is open by
default, (0, 1): solved sometimes, neither never nor always; `inclusive` closes both ends.

The rows written are the input rows unchanged but for `extra_info.filter` (`pass_rate`, `correct`, `k`), in the
input's order; the summary beside them counts the problems never, sometimes and always solved and holds every
problem's rate, so another band needs no new samples. Deliberately not here: dynamic re-sampling during RL
(`rl.dynamic_sampling`) or any re-weighting of the kept problems.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tirl.core.bounds import check_range
from tirl.eval.rejection_sampling import sampled_groups


@dataclass(frozen=True)
class Band:
    """Pass rates kept: `min_rate < rate < max_rate`, or with `inclusive` `min_rate <= rate <= max_rate`."""

    min_rate: float = 0.0
    max_rate: float = 1.0
    inclusive: bool = False

    def __post_init__(self) -> None:
        check_range("--min-rate", self.min_rate, 0.0, 1.0)
        check_range("--max-rate", self.max_rate, 0.0, 1.0)
        if self.max_rate < self.min_rate or (self.max_rate == self.min_rate and not self.inclusive):
            raise ValueError(f"the band {self} is empty: give --min-rate below --max-rate (or --inclusive)")

    def contains(self, rate: float) -> bool:
        if self.inclusive:
            return self.min_rate <= rate <= self.max_rate
        return self.min_rate < rate < self.max_rate

    def check_k(self, k: int) -> None:
        """Refuse a band that holds no rate j/k a problem can have with k samples."""
        if not any(self.contains(j / k) for j in range(k + 1)):
            raise ValueError(f"with --k {k} a pass rate is j/{k}, and none lies in {self}: widen the band")

    def __str__(self) -> str:
        lo, hi = ("[", "]") if self.inclusive else ("(", ")")
        return f"{lo}{self.min_rate:g}, {self.max_rate:g}{hi}"


@dataclass
class FilterStats:
    """What the samples said; written, with the settings, as the summary JSON next to the rows."""

    k: int
    band: str
    problems: int = 0
    kept: int = 0
    never: int = 0  # pass rate 0
    sometimes: int = 0  # 0 < pass rate < 1
    always: int = 0  # pass rate 1
    correct_counts: dict[int, int] = field(default_factory=dict)  # correct samples -> problems
    pass_rates: dict[str, float] = field(default_factory=dict)  # problem id -> rate, every problem

    def add(self, pid: str, correct: int, kept: bool) -> None:
        """One problem with `correct` of its k samples graded correct."""
        self.problems += 1
        self.kept += int(kept)
        self.never += int(correct == 0)
        self.always += int(correct == self.k)
        self.sometimes += int(0 < correct < self.k)
        self.correct_counts[correct] = self.correct_counts.get(correct, 0) + 1
        self.pass_rates[pid] = correct / self.k


def filtered_rows(
    agent: Any,
    rows: list[dict[str, Any]],
    band: Band,
    k: int,
    *,
    params: Any,
    reward: Any,
    seed: int,
    batch_problems: int = 32,
) -> tuple[list[dict[str, Any]], FilterStats]:
    """The rows whose pass rate over `k` samples lies in `band` (with `extra_info.filter`), in input order."""
    stats, out = FilterStats(k=k, band=str(band)), []
    groups = sampled_groups(
        agent, rows, k, params=params, reward=reward, seed=seed, batch_problems=batch_problems,
        what="filter", info=lambda: f"kept {stats.kept}",
    )  # fmt: skip
    for row, (problem, trajs) in zip(rows, groups, strict=True):
        correct = sum(1 for t in trajs if t.outcome is not None and t.outcome.correct)
        keep = band.contains(correct / k)
        stats.add(problem.problem_id, correct, keep)
        if keep:
            info = {**problem.extra, "filter": {"pass_rate": correct / k, "correct": correct, "k": k}}
            out.append({**row, "extra_info": info})
    return out, stats
