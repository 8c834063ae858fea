"""pass@k for every k, Cover@tau and the bootstrap, each against brute-force enumeration on small cases."""

import itertools
import math

import numpy as np
import pytest
from torch.testing import assert_close

from tirl.eval.bootstrap import (
    bootstrap_curve,
    crossover_index,
    crossover_interval,
    paired_difference,
    replicate_means,
    resample_weights,
)
from tirl.eval.metrics import cover_at_tau, pass_at_k, pass_at_k_table


def brute_pass(n: int, c: int, k: int) -> float:
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(i < c for i in s) for s in subsets) / len(subsets)


def test_pass_at_k_table_matches_brute_force_for_every_k() -> None:
    for n in range(1, 9):
        table = pass_at_k_table(n, list(range(n + 1)))
        assert table.shape == (n + 1, n)
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert_close(float(table[c, k - 1]), brute_pass(n, c, k), msg=f"n={n} c={c} k={k}")


def test_pass_at_k_table_large_n_agrees_with_the_product_form() -> None:
    table = pass_at_k_table(1024, [0, 1, 7, 1024])
    for row, c in enumerate([0, 1, 7, 1024]):
        for k in (1, 2, 100, 1000, 1024):
            assert_close(float(table[row, k - 1]), pass_at_k(1024, c, k))
    with pytest.raises(ValueError, match="n=4"):
        pass_at_k_table(4, [5])


def test_cover_at_tau_counts_problems_at_or_above_tau() -> None:
    rates = [0.0, 0.25, 0.5, 0.5, 1.0]
    brute = {t: sum(r >= t for r in rates) / len(rates) for t in (0.1, 0.25, 0.5, 0.75, 1.0)}
    assert cover_at_tau(rates, list(brute)) == brute
    assert cover_at_tau([0.3], [0.3]) == {0.3: 1.0}  # tau equal to the rate counts
    with pytest.raises(ValueError):
        cover_at_tau([], [0.5])


def test_replicate_means_are_means_of_resampled_problems() -> None:
    values = np.array([[0.0, 1.0], [1.0, 1.0], [0.5, 0.0]])
    w = resample_weights(3, 50, seed=1)
    assert (w.sum(axis=1) == 3).all()
    rng = np.random.default_rng(0)
    for b in rng.integers(0, 50, size=5):
        picked = np.repeat(np.arange(3), w[b])  # the problems replicate b drew, with multiplicity
        assert_close(replicate_means(values, w)[b], values[picked].mean(axis=0))


def test_bootstrap_interval_matches_the_exact_bootstrap_distribution() -> None:
    """P=4 problems: all 4^4 equally likely resamples give the exact bootstrap distribution of the mean."""
    values = np.array([[0.0], [0.25], [0.5], [1.0]])
    exact = np.array([values[list(idx), 0].mean() for idx in itertools.product(range(4), repeat=4)])
    ci = bootstrap_curve(values, resample_weights(4, 40000, seed=0))
    assert_close(float(ci.mean[0]), 0.4375)
    assert abs(ci.lo[0] - np.quantile(exact, 0.025)) <= 0.0625 + 1e-9  # one step of the discrete distribution
    assert abs(ci.hi[0] - np.quantile(exact, 0.975)) <= 0.0625 + 1e-9


def test_bootstrap_is_seeded() -> None:
    values = np.random.default_rng(0).random((30, 3))
    a = bootstrap_curve(values, resample_weights(30, 200, seed=5))
    b = bootstrap_curve(values, resample_weights(30, 200, seed=5))
    assert (a.lo == b.lo).all() and (a.hi == b.hi).all()
    c = bootstrap_curve(values, resample_weights(30, 200, seed=6))
    assert not (a.lo == c.lo).all()


def test_paired_difference_cancels_problem_difficulty() -> None:
    rng = np.random.default_rng(0)
    base = rng.random((200, 4))
    other = base + 0.05  # better by exactly 0.05 on every problem
    diff, share, reps = paired_difference(base, other, resample_weights(200, 300, seed=0))
    assert_close(diff.mean, np.full(4, 0.05))
    assert_close(diff.lo, np.full(4, 0.05))  # two statements: `a() and b()` never ran b (a returns None)
    assert_close(diff.hi, np.full(4, 0.05))
    assert (share == 1.0).all() and reps.shape == (300, 4)
    with pytest.raises(ValueError, match="shape"):
        paired_difference(base, other[:10], resample_weights(200, 10, seed=0))


def test_crossover_index() -> None:
    assert crossover_index(np.array([0.2, 0.1, 0.0, -0.1])) == 3  # a tie is not a crossover
    assert crossover_index(np.array([0.2, 0.1, -0.05])) == 2
    assert crossover_index(np.array([0.2, 0.1, 0.05])) is None
    assert crossover_index(np.array([-0.2, -0.1, 0.1])) == 2  # the other way round
    assert crossover_index(np.array([0.0, 0.1])) == 0
    assert crossover_index(np.array([0.1, 0.3]), sign=-1.0) == 0
    reps = np.array([[0.2, 0.1, -0.1], [0.2, -0.1, -0.1], [0.2, 0.1, 0.1]] * 10)
    iv = crossover_interval(reps, 1.0, np.array([1, 2, 3]))
    assert iv["lo"] == 2 and iv["hi"] is None and iv["share_with_crossover"] == pytest.approx(2 / 3)
    assert math.isclose(crossover_interval(reps[:2], 1.0, np.array([1, 2, 3]))["hi"], 3)
