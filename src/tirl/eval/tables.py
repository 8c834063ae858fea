"""What every analysis behind `tirl analyze` starts from: its settings (`AnalysisConfig`) and each run's grades as
one (P, n) table per data source and temperature (`Table`, `build_tables`).

A counts-only run (tirl.eval.counts) gives each problem c correct then n - c wrong grades: pass@k, Cover@tau, the
histogram, the envelope and the comparisons need only n and c. What needs the samples (maj@k and verl's bootstrap
estimators need the answers; tool use, the reasoning mode and the audit the responses) is skipped for it, never
computed from the placeholder grades: such a table has no answers, and cannot be cut to fewer samples.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from tirl.core.bounds import MAX_COUNT
from tirl.eval.counts import count_groups, temperature_key
from tirl.eval.samples import Run, Sample


@dataclass
class AnalysisConfig:
    num_resamples: int = 1000  # bootstrap replicates over problems
    seed: int = 0
    level: float = 0.95  # interval coverage
    taus: list[float] = field(default_factory=lambda: [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0])
    maj_exact_limit: int = 20000  # enumerate k-subsets up to this many, else Monte Carlo
    maj_samples: int = 500  # Monte Carlo subsets per problem and k
    max_examples: int = 5  # audit examples kept per model

    def __post_init__(self) -> None:
        if not 10 <= self.num_resamples <= MAX_COUNT:  # replicates x problems are held at once
            raise ValueError(f"num_resamples (--bootstrap) must be 10-{MAX_COUNT}, got {self.num_resamples}")
        if not 0.5 < self.level < 1.0:
            raise ValueError(f"level must lie in (0.5, 1), got {self.level}")
        if not self.taus or any(not 0.0 < t <= 1.0 for t in self.taus):
            raise ValueError(f"taus must lie in (0, 1], got {self.taus}")


@dataclass
class Table:
    """One model's samples on one data source at one temperature: (P, n) grades, answers per problem (None for a
    counts-only run, whose grades are c correct then n - c wrong: they cannot be cut to fewer samples)."""

    ids: list[str]
    correct: np.ndarray  # (P, n) bool
    answers: list[list[str | None]] | None

    @property
    def n(self) -> int:
        return self.correct.shape[1]

    def subset(self, ids: Sequence[str], n: int) -> Table:
        pos = {pid: i for i, pid in enumerate(self.ids)}
        rows = [pos[pid] for pid in ids]
        if self.answers is None:
            if n < self.n:  # the first n of c-then-wrong grades are not a sample of them
                raise ValueError(f"counts-only grades (n={self.n}) cannot be cut to {n} samples")
            return Table(list(ids), self.correct[rows], None)
        return Table(list(ids), self.correct[rows, :n], [self.answers[r][:n] for r in rows])


def build_tables(run: Run) -> dict[str, dict[str, Table]]:
    """source -> temperature key -> Table; every problem must have the same number of samples."""
    if run.counts is not None:
        tables: dict[str, dict[str, Table]] = defaultdict(dict)
        for (source, tkey), (ids, n, c) in count_groups(run.counts, run.path).items():
            tables[source][tkey] = Table(ids, np.arange(n)[None, :] < c[:, None], None)  # (P, n)
        return tables
    groups: dict[tuple[str, str], dict[str, list[Sample]]] = defaultdict(lambda: defaultdict(list))
    for s in run.samples:
        r = s.record
        groups[(r.data_source, temperature_key(r.temperature))][r.problem_id].append(s)
    out: dict[str, dict[str, Table]] = defaultdict(dict)
    for (source, tkey), problems in sorted(groups.items()):
        sizes = {pid: len(v) for pid, v in problems.items()}
        n = Counter(sizes.values()).most_common(1)[0][0]
        if len(set(sizes.values())) > 1:
            odd = next(pid for pid, m in sizes.items() if m != n)
            raise ValueError(
                f"{run.path}: model {run.label!r}, source {source!r}, T={tkey}: problems have different sample "
                f"counts (most have {n}; problem {odd!r} has {sizes[odd]}); pass@k needs one n per problem"
            )
        ids = sorted(problems)
        ordered = [sorted(problems[pid], key=lambda s: s.record.sample_index) for pid in ids]
        correct = np.array([[s.record.correct for s in ss] for ss in ordered], dtype=bool)
        out[source][tkey] = Table(ids, correct, [[s.record.pred for s in ss] for ss in ordered])
    return out
