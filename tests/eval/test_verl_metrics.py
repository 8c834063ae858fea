"""tirl's port of verl's bootstrap best@k / maj@k against a transcription of verl's function (same draws, same seed)."""

import random

import pytest
import verl_metrics_reference as ref

from tirl.eval.verl_metrics import (
    bootstrap_best_at_k,
    bootstrap_indices,
    bootstrap_maj_at_k,
    bootstrap_summary,
    verl_ks,
)


def _seeded_problem(seed: int, n: int) -> tuple[list[bool], list[str]]:
    rnd = random.Random(seed)
    preds = [rnd.choice(["1", "2", "3", "", "01"]) for _ in range(n)]
    truth = rnd.choice(["1", "2", "3"])
    return [p == truth for p in preds], preds


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("n", [2, 5, 8, 32])
def test_same_numbers_as_verl_transcription(seed: int, n: int) -> None:
    acc, preds = _seeded_problem(seed, n)
    want = ref.problem_metrics(acc, preds)
    got = {}
    for k in verl_ks(n):
        got[f"best@{k}/mean"] = bootstrap_best_at_k(acc, k)
        got[f"maj@{k}/mean"] = bootstrap_maj_at_k(preds, acc, k)
    assert got == want  # the same draws give the same floats, bit for bit


def test_draws_are_numpy_legacy_draws_one_row_per_iteration() -> None:
    import numpy as np

    np.random.seed(42)
    loop = np.stack([np.random.choice(7, size=3, replace=True) for _ in range(1000)])
    assert (bootstrap_indices(7, 3) == loop).all()


def test_one_correct_of_32_gives_verl_best_at_32_well_below_one() -> None:
    acc = [True] + [False] * 31
    got = bootstrap_best_at_k(acc, 32)
    assert got == ref.problem_metrics(acc, [""] * 32)["best@32/mean"]
    assert 0.6 < got < 0.68  # 1 - (31/32)^32 = 0.639 in expectation


def test_missing_answer_votes_as_empty_string_and_can_win() -> None:
    preds = [None, None, None, "7"]
    acc = [False, False, False, True]
    got = bootstrap_maj_at_k(preds, acc, 4)
    assert got == ref.problem_metrics(acc, ["", "", "", "7"])["maj@4/mean"]
    assert got < 0.2


def test_tie_goes_to_the_answer_drawn_first() -> None:
    # two samples, k=2: a draw (0, 1) ties 1-1 and the first drawn answer wins
    idx = bootstrap_indices(2, 2)
    first_is_right = (idx[:, 0] == 0).mean()
    assert bootstrap_maj_at_k(["a", "b"], [True, False], 2) == pytest.approx(first_is_right, abs=0)


def test_raw_strings_do_not_merge_equivalent_answers() -> None:
    # "25" and "025" are one answer for tirl's exact maj@k, two votes here
    preds = ["025", "025", "25"]
    acc = [False, False, True]
    assert bootstrap_maj_at_k(preds, acc, 3) == ref.problem_metrics(acc, preds)["maj@3/mean"]


def test_summary_names_say_bootstrap() -> None:
    out = bootstrap_summary([True, False], ["1", "2"], [1, 2])
    assert set(out) == {"bootstrap_best@1", "bootstrap_best@2", "bootstrap_maj@1", "bootstrap_maj@2"}


def test_bad_arguments_raise() -> None:
    with pytest.raises(ValueError, match="differ in length"):
        bootstrap_maj_at_k(["1"], [True, False], 1)
    with pytest.raises(ValueError, match="k and draws"):
        bootstrap_indices(3, 0)


def test_analyze_reports_verl_numbers_beside_the_unbiased_ones():
    import numpy as np

    from tirl.eval.accuracy import model_block
    from tirl.eval.tables import AnalysisConfig, Table

    problems = [_seeded_problem(s, 8) for s in range(3)]
    table = Table(["a", "b", "c"], np.array([c for c, _ in problems]), [list(p) for _, p in problems])
    block, _ = model_block(table, AnalysisConfig(num_resamples=10))
    verl = block["verl_bootstrap"]
    assert verl["ks"] == [1, 2, 4, 8]
    want = [ref.problem_metrics(c, p)["best@8/mean"] for c, p in problems]
    assert verl["best@k"][-1] == pytest.approx(sum(want) / 3, abs=1e-12)
    assert "pass@k" in block and "maj@k" in block  # tirl's own estimators stay
