"""GSM8K's splits fixed apart from the training seed (`task.split_seed`), and the test split's size: at most the
problems of the levels, all 422 of one or two calculator steps."""

from __future__ import annotations

import pytest

from tirl.tasks.gsm8k import (
    GSM8KOptions,
    calculator_steps,
    gsm8k_records,
    gsm8k_rows,
    sample_pool,
    study_splits,
)

STUDY = {"name": "gsm8k", "num_sft": 2000, "num_rl": 270, "num_val": 100, "num_test": 200, "levels": [1, 2]}


def _options(**task) -> GSM8KOptions:
    return GSM8KOptions(**{**STUDY, **task})


def _splits(options: GSM8KOptions, seed: int) -> dict[str, list[str]]:
    """Every split's problem ids, in order."""
    val, pool = study_splits(options, seed)
    return {
        "test": [r["extra_info"]["id"] for r in gsm8k_rows("test", options, seed)],
        "rl": [r["extra_info"]["id"] for r in gsm8k_rows("train", options, seed)],
        "val": [r["extra_info"]["id"] for r in val],
        "sft pool": [f"gsm8k-train-{i}" for i in pool],
        "sample pool": [r["extra_info"]["id"] for r in sample_pool(options, seed)],
    }


def test_a_seed_on_another_seeds_split_gets_its_rows():
    assert _splits(_options(split_seed=0), 1) == _splits(_options(), 0)


def test_the_seed_alone_draws_other_problems():
    seed0, seed1 = _splits(_options(), 0), _splits(_options(), 1)
    for name in seed0:
        assert seed0[name] != seed1[name], name
    assert seed0 != _splits(_options(split_seed=1), 0)  # the split seed, not the run's seed, draws them


def test_the_default_split_seed_keeps_the_study_splits():
    """The first problems of each split of the committed study (seed 0), as the task drew them before
    `task.split_seed` existed."""
    got = _splits(_options(), 0)
    assert got["test"][:3] == ["gsm8k-484", "gsm8k-517", "gsm8k-1133"]
    assert got["rl"][:3] == ["gsm8k-train-151", "gsm8k-train-6349", "gsm8k-train-4068"]
    assert got["val"][:3] == ["gsm8k-train-6251", "gsm8k-train-6882", "gsm8k-train-6261"]
    assert got["sft pool"][:3] == ["gsm8k-train-7378", "gsm8k-train-2704", "gsm8k-train-746"]


def test_split_seed_out_of_range_names_the_key():
    with pytest.raises(ValueError, match="task.split_seed"):
        _options(split_seed=-2)


def test_num_test_of_422_takes_every_one_or_two_step_test_problem():
    rows = gsm8k_rows("test", _options(num_test=422), 0)
    every = {f"gsm8k-{i}" for i, r in enumerate(gsm8k_records("test")) if calculator_steps(r) in (1, 2)}
    assert len(every) == 422 and {r["extra_info"]["id"] for r in rows} == every and len(rows) == 422


def test_num_test_beyond_the_levels_names_the_count_available():
    with pytest.raises(ValueError, match=r"task.num_test = 423 but only 422 test problems have \[1, 2\]"):
        gsm8k_rows("test", _options(num_test=423), 0)
