"""`eval:` of a run's config: what `tirl eval` samples (problems, samples per problem, temperatures, the ks of
pass@k) and in-training validation's generation log, checked when loaded. The evaluation that reads it is
`tirl.eval.evaluate`."""

from __future__ import annotations

from dataclasses import dataclass, field

from tirl.core.bounds import MAX_COUNT, MAX_IN_FLIGHT, check_counts, check_product


@dataclass
class EvalConfig:
    data: str = ""  # JSONL of rows in the RL schema
    n: int = 8  # samples per problem
    temperature: float = 1.0
    temperatures: list[float] = field(default_factory=list)  # several in one call; empty = [temperature]
    top_p: float = 1.0
    max_problems: int = 0  # 0 = all rows
    batch_problems: int = 32  # problems rolled out together (each with its n samples)
    ks: list[int] = field(default_factory=list)  # empty = 1, 2, 4, ..., n
    log_generations: int = 0  # in-training validation: samples logged as text each time (verl logs 20)

    def __post_init__(self) -> None:
        if self.n < 1 or self.batch_problems < 1:
            raise ValueError(
                f"eval.n and eval.batch_problems must be >= 1, got {self.n}, {self.batch_problems}"
            )
        if any(k < 1 or k > self.n for k in self.ks):
            raise ValueError(f"eval.ks must lie in [1, n={self.n}], got {self.ks}")
        if any(t < 0 for t in [self.temperature, *self.temperatures]):
            raise ValueError(f"eval temperatures must be >= 0, got {self.temperature}, {self.temperatures}")
        if self.log_generations < 0:
            raise ValueError(f"eval.log_generations must be >= 0, got {self.log_generations}")
        if len(set(self.temperatures)) != len(self.temperatures):
            raise ValueError(f"eval.temperatures has duplicates: {self.temperatures}")
        bounds = {"n": (1, MAX_COUNT), "batch_problems": (1, MAX_COUNT), "log_generations": (0, MAX_COUNT)}
        check_counts(self, "eval", bounds)
        check_product(  # every sample of a batch's problems is rolled out, and held, at once
            ("eval.n", "eval.batch_problems"), (self.n, self.batch_problems), MAX_IN_FLIGHT,
            "trajectories held at once", "lower eval.batch_problems",
        )  # fmt: skip

    @property
    def all_temperatures(self) -> list[float]:
        return list(self.temperatures) or [self.temperature]
