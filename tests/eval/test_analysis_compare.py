"""The comparison on synthetic models whose per-problem success rates are known in closed form."""

import math

import numpy as np
import pytest
from torch.testing import assert_close

from tirl.eval.analysis import analyze_runs
from tirl.eval.comparison import crossover_sentence
from tirl.eval.evaluate import SampleRecord
from tirl.eval.samples import Run, Sample
from tirl.eval.tables import AnalysisConfig, build_tables

N = 10  # samples per problem
P = 50  # problems


def make_run(label: str, counts: list[int], *, temperature: float = 1.0, answers=None) -> Run:
    """Problem i has exactly counts[i] correct samples out of N (wrong ones answer "wrong")."""
    samples = []
    for i, c in enumerate(counts):
        for k in range(N):
            ok = k < c
            pred = "42" if ok else (answers or "wrong")
            rec = SampleRecord(label, f"q{i:02d}", "synthetic", k, temperature, 1.0, ok, 1.0 if ok else -1.0,
                               pred, 1, 0, 2, 10, "answer")  # fmt: skip
            samples.append(Sample(rec))
    return Run(label, f"/synthetic/{label}", "tirl", samples)


def hyper(c: int, k: int) -> float:
    """pass@k of a problem with c correct of N, in closed form: 1 - C(N-c, k) / C(N, k)."""
    return 1 - math.comb(N - c, k) / math.comb(N, k)


CFG = AnalysisConfig(num_resamples=300, seed=0)


def test_crossover_and_solvable_sets_match_closed_form() -> None:
    # base: every problem at 3/10. rl: 9/10 on the first 30 problems, 0/10 on the last 20 (sharpened, narrowed).
    base = make_run("base", [3] * P)
    rl = make_run("rl", [9] * 30 + [0] * 20)
    report = analyze_runs([base, rl], CFG)
    src = report["sources"]["synthetic"]
    b = src["models"]["base"]["temperatures"]["1"]
    r = src["models"]["rl"]["temperatures"]["1"]
    ks = range(1, N + 1)
    assert_close(b["pass@k"]["mean"], [hyper(3, k) for k in ks])
    assert_close(r["pass@k"]["mean"], [0.6 * hyper(9, k) for k in ks])
    expected_k = next(k for k in ks if hyper(3, k) > 0.6 * hyper(9, k))
    assert expected_k == 3  # 1 - C(7,3)/C(10,3) = 0.708 >= 0.6 * 1 = 0.6, while at k=2: 0.533 < 0.6
    (c,) = src["comparisons"]
    assert c["crossover"] == {**c["crossover"], "k": expected_k, "ahead_at_k1": "rl"}
    iv = c["crossover"]["interval"]
    assert iv["lo"] <= expected_k <= iv["hi"]
    s = c["solvable"]
    assert s["base_only"] == [f"q{i:02d}" for i in range(30, 50)] and s["other_only"] == []
    assert (s["both_count"], s["neither_count"]) == (30, 0)
    # per-problem histograms: base all at 3/10; rl pushed to 9/10 and to 0
    assert (
        b["histogram"]["counts"][3] == P
        and r["histogram"]["counts"][0] == 20
        and r["histogram"]["counts"][9] == 30
    )
    assert_close(b["cover"]["mean"][:4], [1.0, 1.0, 1.0, 0.0])  # taus 0.1, 0.2, 0.3 reached; 0.4 not
    assert "rl leads at k=1; base overtakes it at k=3" in crossover_sentence(c)


def test_no_crossover_when_one_model_dominates() -> None:
    report = analyze_runs([make_run("base", [3] * P), make_run("rl", [5] * P)], CFG)
    (c,) = report["sources"]["synthetic"]["comparisons"]
    assert c["crossover"]["k"] is None and c["crossover"]["ahead_at_k1"] == "rl"
    assert c["crossover"]["interval"]["share_with_crossover"] < 0.05
    assert "no crossover" in crossover_sentence(c)
    assert c["diff"]["mean"][-1] == 0.0  # both saturate at 1 for k > N - 3: a tie, not a crossover


def test_envelope_picks_the_best_temperature_per_k() -> None:
    # T=0.6: 6/10 on every problem (good at k=1); T=1.0: 3/10 on all but solves every problem (same here);
    # make T=1.0 better at large k by giving T=0.6 zero on a tenth of the problems.
    cold = make_run("m", [6] * 45 + [0] * 5, temperature=0.6)
    hot = make_run("m", [4] * P, temperature=1.0)
    both = Run("m", "/synthetic/m", "tirl", cold.samples + hot.samples)
    report = analyze_runs([both], CFG)
    env = report["sources"]["synthetic"]["models"]["m"]["envelope"]
    cold_curve = [0.9 * hyper(6, k) for k in range(1, N + 1)]
    hot_curve = [hyper(4, k) for k in range(1, N + 1)]
    best = ["0.6" if a >= b else "1" for a, b in zip(cold_curve, hot_curve)]
    assert env["best_temperature"] == best and best[0] == "0.6" and best[-1] == "1"
    assert_close(env["pass@k"]["mean"], np.maximum(cold_curve, hot_curve).tolist())


def test_temperatures_are_compared_pairwise_and_by_envelope() -> None:
    a = Run(
        "a", "/a", "tirl", make_run("a", [3] * P, temperature=0.6).samples + make_run("a", [4] * P).samples
    )
    b = Run(
        "b", "/b", "tirl", make_run("b", [5] * P, temperature=0.6).samples + make_run("b", [2] * P).samples
    )
    report = analyze_runs([a, b], CFG)
    conditions = [c["condition"] for c in report["sources"]["synthetic"]["comparisons"]]
    assert conditions == ["T=0.6", "T=1", "best T per k on the test set (envelope, an upper bound)"]


def test_unequal_sample_counts_are_a_clear_error() -> None:
    run = make_run("m", [3] * 3)
    run.samples.pop()
    with pytest.raises(ValueError, match="most have 10; problem 'q02' has 9"):
        build_tables(run)
    with pytest.raises(ValueError, match="distinct"):
        analyze_runs([make_run("m", [1]), make_run("m", [2])], CFG)


def test_maj_at_k_groups_equivalent_answers() -> None:
    """Wrong answers spelled differently but equal ("1/2", "0.5") vote together and beat the right one."""
    samples = []
    preds = ["42", "1/2", "0.5", "\\frac{1}{2}"]
    for k, pred in enumerate(preds):
        rec = SampleRecord("m", "q", "s", k, 1.0, 1.0, pred == "42", 0.0, pred, 0, 0, 1, 5, "answer")
        samples.append(Sample(rec))
    report = analyze_runs([Run("m", "/m", "tirl", samples)], CFG)
    block = report["sources"]["s"]["models"]["m"]["temperatures"]["1"]
    assert block["maj_ks"] == [1, 2, 4]
    assert block["maj@k"]["mean"][2] == 0.0  # 3 votes for one half against 1 for 42
    # k=2: 6 pairs; {42, x} ties (3 pairs, 1/2 each), pairs of halves lose: 1.5 / 6
    assert block["maj@k"]["mean"][1] == pytest.approx(0.25)


def test_plots_of_sources_with_alike_names_do_not_overwrite_each_other(tmp_path) -> None:
    from tirl.eval.plots import plot_report

    runs = []
    for label, counts in (("base", [3] * 4), ("rl", [9, 9, 0, 0])):
        run = make_run(label, counts)
        for s in run.samples[: len(run.samples) // 2]:
            s.record.data_source = "openai/gsm8k"  # both slug to "openai-gsm8k"
        for s in run.samples[len(run.samples) // 2 :]:
            s.record.data_source = "openai-gsm8k"
        runs.append(run)
    figures = plot_report(analyze_runs(runs, CFG), tmp_path)
    paths = [p for figs in figures.values() for _, p in figs]
    assert len(set(paths)) == 6 and len(list(tmp_path.glob("*.png"))) == 6
