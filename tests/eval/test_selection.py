"""Temperatures chosen on validation and differences pooled over seeds (tirl.eval.selection), by hand-computed
cases, and `tirl analyze --choose-temperature-on ... --seeds ...` end to end on synthetic eval directories."""

import json
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
from torch.testing import assert_close

from tirl.cli import main
from tirl.eval.evaluate import SampleRecord
from tirl.eval.samples import Run, Sample
from tirl.eval.selection import (
    ABOVE,
    INCLUDES_ZERO,
    Counts,
    choose_temperatures,
    curve_at_chosen,
    missing_temperatures,
    paired_at_chosen,
    paired_over_seeds,
    pass_at_ks,
    pooled_difference,
)
from tirl.eval.selection_report import plan_runs

IDS = ["p0", "p1"]


def counts(cs: list[int], n: int, ids: list[str] | None = None) -> Counts:
    return Counts(ids or [f"p{i}" for i in range(len(cs))], np.array(cs), n)


def test_chosen_temperature_per_k_matches_hand_computation() -> None:
    # n = 4. T=0.6: problem 0 always right, problem 1 never: pass@k = (1 + 0) / 2 = 0.5 at every k.
    # T=1.0: one right of four on each: pass@k = 1 - C(3, k) / C(4, k) = 1/4, 1/2, 3/4, 1.
    val = {0.6: counts([4, 0], 4), 1.0: counts([1, 1], 4)}
    choice = choose_temperatures(val, [1, 2, 3, 4])
    assert_close(choice.validation, np.array([[0.5, 0.5, 0.5, 0.5], [0.25, 0.5, 0.75, 1.0]]))
    # k=1: 0.5 > 0.25; k=2: a tie (0.5 = 0.5), which goes to the temperature closer to 1.0; k=3, 4: T=1.0 ahead
    assert choice.chosen == [0.6, 1.0, 1.0, 1.0]
    assert choice.num_problems == 2


def test_ties_go_to_the_temperature_closest_to_one_then_the_lower() -> None:
    same = counts([1, 0], 2)
    assert choose_temperatures({0.8: same, 1.2: same}, [1, 2]).chosen == [0.8, 0.8]  # equally close: lower
    assert choose_temperatures({0.4: same, 1.4: same}, [1, 2]).chosen == [1.4, 1.4]  # 0.4 off 1.0 against 0.6


def test_a_choice_at_the_grids_lowest_temperature_is_flagged_and_one_inside_is_not() -> None:
    # as in the hand-computed case, with T=0.2 for 0.6's counts and T=0.6 for 1.0's, plus a T=1.4 that never solves
    val = {0.2: counts([4, 0], 4), 0.6: counts([1, 1], 4), 1.4: counts([0, 0], 4)}
    choice = choose_temperatures(val, [1, 2, 3, 4])
    assert choice.chosen == [0.2, 0.6, 0.6, 0.6]
    assert choice.on_edge == [True, False, False, False]
    assert choice.to_dict()["edge_ks"] == [1]


def test_test_curve_takes_each_k_at_its_chosen_temperature() -> None:
    choice = choose_temperatures({0.6: counts([4, 0], 4), 1.0: counts([1, 1], 4)}, [1, 2, 3, 4])
    # test: T=0.6 two of four on both problems (pass@1 = 1/2); T=1.0 none on p0, all on p1 (pass@k = 1/2)
    test = {0.6: counts([2, 2], 4), 1.0: counts([0, 4], 4)}
    curve = curve_at_chosen(test, choice, num_resamples=200)
    # k=1 at 0.6: 1/2; k=2..4 at 1.0: (0 + 1) / 2
    assert_close(curve.ci.mean, np.array([0.5, 0.5, 0.5, 0.5]))
    assert curve.chosen == [0.6, 1.0, 1.0, 1.0]
    assert (curve.ci.lo <= curve.ci.mean).all() and (curve.ci.mean <= curve.ci.hi).all()


def test_a_chosen_temperature_the_test_runs_lack_is_named_with_its_ks() -> None:
    choice = choose_temperatures({0.6: counts([4, 0], 4), 1.0: counts([1, 1], 4)}, [1, 2, 3, 4])
    test = {1.0: counts([0, 4], 4)}
    assert missing_temperatures(test, choice) == {0.6: [1]}
    with pytest.raises(ValueError, match=r"lack the chosen temperatures \[0.6\]"):
        curve_at_chosen(test, choice)


def test_paired_difference_pairs_each_model_at_its_own_chosen_temperature() -> None:
    # base chooses 0.6 at k=1, other chooses 1.0 at k=1 (validation), on the same two test problems
    base = choose_temperatures({0.6: counts([2, 0], 2), 1.0: counts([0, 0], 2)}, [1])
    other = choose_temperatures({0.6: counts([0, 0], 2), 1.0: counts([2, 0], 2)}, [1])
    test = {0.6: counts([1, 0], 2), 1.0: counts([2, 2], 2)}
    a = curve_at_chosen(test, base, num_resamples=200)
    b = curve_at_chosen(test, other, num_resamples=200)
    d = paired_at_chosen(a, b, num_resamples=200)
    # base at 0.6: (1/2 + 0) / 2 = 1/4; other at 1.0: 1; difference 3/4
    assert_close(d.diff.mean, np.array([0.75]))
    assert d.verdict == [ABOVE]


def test_pooled_interval_contains_the_hand_computed_mean() -> None:
    # pass@1 with n = 2: per seed, other - base on four problems
    seeds = {
        "0": ([1, 0, 1, 0], [2, 0, 2, 0]),  # diffs 1/2, 0, 1/2, 0: mean 1/4
        "1": ([0, 0, 1, 1], [1, 1, 1, 1]),  # 1/2, 1/2, 0, 0: 1/4
        "2": ([0, 1, 0, 0], [2, 1, 1, 1]),  # 1, 0, 1/2, 1/2: 1/2
    }
    ids = ["a", "b", "c", "d"]
    per_seed = {
        s: (ids, pass_at_ks(counts(a, 2, ids), [1]), ids, pass_at_ks(counts(b, 2, ids), [1]))
        for s, (a, b) in seeds.items()
    }
    pooled, dropped = paired_over_seeds(per_seed, [1], num_resamples=2000)
    mean = (0.25 + 0.25 + 0.5) / 3
    assert_close(pooled.pooled.mean, np.array([mean]))
    assert pooled.pooled.lo[0] <= mean <= pooled.pooled.hi[0] and pooled.pooled.lo[0] < pooled.pooled.hi[0]
    assert_close([ci.mean[0] for ci in pooled.per_seed], [0.25, 0.25, 0.5])
    assert dropped == {"0": 0, "1": 0, "2": 0}


def test_a_problem_missing_from_one_seed_is_left_out_of_every_seed() -> None:
    ids, short = ["a", "b", "c"], ["a", "b"]
    values = np.array([[0.0], [0.5], [1.0]])
    per_seed = {"0": (ids, values, ids, values + 0.0), "1": (short, values[:2], ids, values)}
    pooled, dropped = paired_over_seeds(per_seed, [1], num_resamples=50)
    assert pooled.num_problems == 2 and dropped == {"0": 1, "1": 1}


def test_one_problem_draw_serves_every_seed_of_a_replicate() -> None:
    # identical seeds: resampling seeds changes nothing, so with the problem draw shared by the seeds the pooled
    # interval is the single seed's; independent draws per seed would narrow it by about sqrt(3)
    rng = np.random.default_rng(1)
    one = rng.normal(0.1, 0.3, size=(40, 1))
    pooled = pooled_difference(np.stack([one, one, one]), ["0", "1", "2"], [1], num_resamples=500)
    assert_close(pooled.pooled.lo, pooled.per_seed[0].lo)
    assert_close(pooled.pooled.hi, pooled.per_seed[0].hi)


def _seed_pair(rng: np.random.Generator, lift: float, P: int = 60, n: int = 8) -> tuple:
    """One seed's base and other counts: problem rates shared by both, other's raised by `lift`."""
    rate = rng.uniform(0.1, 0.5, size=P)
    ids = [f"q{i}" for i in range(P)]
    base = rng.binomial(n, rate)
    other = rng.binomial(n, np.clip(rate + lift, 0, 1))
    return ids, pass_at_ks(counts(base, n, ids), [1, 8]), ids, pass_at_ks(counts(other, n, ids), [1, 8])


def test_a_planted_difference_is_found_in_three_of_three_seeds() -> None:
    rng = np.random.default_rng(0)
    per_seed = {s: _seed_pair(rng, 0.4) for s in ("0", "1", "2")}
    pooled, _ = paired_over_seeds(per_seed, [1, 8], num_resamples=1000)
    assert pooled.verdict[0] == ABOVE and pooled.holds_in(1, ABOVE) == 3


def test_a_null_difference_is_not_found_in_three_of_three_seeds() -> None:
    rng = np.random.default_rng(0)
    per_seed = {s: _seed_pair(rng, 0.0) for s in ("0", "1", "2")}
    pooled, _ = paired_over_seeds(per_seed, [1, 8], num_resamples=1000)
    assert pooled.verdict[0] == INCLUDES_ZERO and pooled.holds_in(1, ABOVE) < 3


def _run(label: str, path: str, temps: list[float]) -> Run:
    samples = [
        Sample(SampleRecord(label, "p", "s", 0, t, 1.0, True, 1.0, "1", 0, 0, 1, 5, "answer")) for t in temps
    ]
    return Run(label, path, "tirl", samples)


def test_runs_of_one_label_and_seed_are_merged_and_paired_within_their_seed() -> None:
    runs = [
        _run("sft", "/a", [0.6]),
        _run("sft", "/b", [1.0]),
        _run("sft", "/c", [1.0]),
        _run("rl", "/d", [1.0]),
    ]
    plan = plan_runs(runs, seeds=["0", "0", "1", "1"])
    assert [r.label for r in plan.runs] == ["sft seed 0", "sft seed 1", "rl seed 1"]
    assert len(plan.runs[0].samples) == 2  # /a and /b: one model at two temperatures
    assert plan.pairs == [("sft seed 1", "rl seed 1")]  # rl has no seed 0: nothing to pair it with


def test_two_runs_of_one_label_and_seed_at_the_same_temperature_are_an_error() -> None:
    with pytest.raises(ValueError, match=r"runs /a and /b both hold source 's' at T=1"):
        plan_runs([_run("sft", "/a", [1.0]), _run("sft", "/b", [1.0])], seeds=["0", "0"])


def test_a_validation_run_that_is_its_test_run_is_an_error() -> None:
    with pytest.raises(ValueError, match="both a test run and its validation run"):
        plan_runs([_run("sft", "/a", [1.0])], [_run("sft", "/a", [1.0])])


def _eval_dir(path: Path, model: str, prefix: str, by_t: dict[float, int], P: int, n: int = 4) -> str:
    """An eval directory: at each temperature, every problem has by_t[T] of n samples right."""
    path.mkdir(parents=True)
    lines = [
        json.dumps(
            asdict(
                SampleRecord(
                    model,
                    f"{prefix}{i:02d}",
                    "synthetic",
                    k,
                    t,
                    1.0,
                    k < c,
                    float(k < c),
                    "1" if k < c else "2",
                    1,
                    0,
                    2,
                    10,
                    "answer",
                )
            )
        )  # fmt: skip
        for t, c in by_t.items()
        for i in range(P)
        for k in range(n)
    ]
    (path / "records.jsonl").write_text("\n".join(lines) + "\n")
    return str(path)


def test_analyze_chooses_on_validation_and_pools_over_seeds(tmp_path) -> None:
    tests, vals = [], []
    for label, val_c, test_c in (("sft", {0.6: 3, 1.0: 0, 1.4: 0}, {0.6: 1, 1.0: 0}),
                                 ("rl", {0.6: 0, 1.0: 3, 1.4: 0}, {0.6: 0, 1.0: 3})):  # fmt: skip
        for s in range(3):
            tests.append(_eval_dir(tmp_path / f"{label}-{s}", label, "t", test_c, P=20))
            vals.append(_eval_dir(tmp_path / f"{label}-{s}-val", label, "v", val_c, P=10))
    out = tmp_path / "analysis"
    args = ["analyze", *tests, "--labels", "sft,sft,sft,rl,rl,rl", "--seeds", "0,1,2,0,1,2",
            "--choose-temperature-on", ",".join(vals), "--out", str(out), "--bootstrap", "50", "--no-viewer"]  # fmt: skip
    assert main(args) == 0
    report = json.loads((out / "report.json").read_text())
    chosen = report["validation_chosen"]["synthetic"]["models"]
    # sft solves only at 0.6 (3 of 4 right), the grid's lowest temperature: every k flagged; rl only at 1.0
    assert chosen["sft seed 0"]["chosen_temperature"] == [0.6] * 4 and chosen["sft seed 0"]["edge_ks"] == [
        1,
        2,
        3,
        4,
    ]
    assert chosen["rl seed 2"]["chosen_temperature"] == [1.0] * 4 and chosen["rl seed 2"]["edge_ks"] == []
    pairs = {(c["base"], c["other"]) for c in report["sources"]["synthetic"]["comparisons"]}
    assert pairs == {(f"sft seed {s}", f"rl seed {s}") for s in range(3)}  # never across seeds
    (at_chosen,) = [e for e in report["seeds"]["synthetic"] if e["condition"] == "validation-chosen T"]
    # test pass@1: sft at 0.6 is 1/4, rl at 1.0 is 3/4 on every problem of every seed
    assert at_chosen["seeds"] == ["0", "1", "2"] and at_chosen["pooled"]["mean"][0] == pytest.approx(0.5)
    assert at_chosen["verdict"][0] == "above" and at_chosen["holds_in"][0] == 3
    assert any("over seeds 0, 1, 2 (validation-chosen T" in f for f in report["findings"])
    assert "Validation-chosen temperature" in (out / "report.html").read_text()


def _counts_file(path: Path, prefix: str, by_t: dict[float, int], P: int, n: int = 4) -> str:
    rows = [
        json.dumps(
            {
                "data_source": "synthetic",
                "temperature": t,
                "problem_id": f"{prefix}{i:02d}",
                "n": n,
                "correct": c,
            }
        )
        for t, c in by_t.items()
        for i in range(P)
    ]
    path.write_text("\n".join(rows) + "\n")
    return str(path)


def test_choice_and_pooling_run_from_counts_files_alone(tmp_path) -> None:
    from tirl.eval.report import run_analyze
    from tirl.eval.tables import AnalysisConfig

    tests, vals = [], []
    for label, val_c, test_c in (("sft", {0.6: 0, 1.0: 2}, {1.0: 1}), ("rl", {0.6: 0, 1.0: 2}, {1.0: 3})):
        for s in range(2):
            tests.append(_counts_file(tmp_path / f"{label}-{s}.counts.jsonl", "t", test_c, P=10))
            vals.append(_counts_file(tmp_path / f"{label}-{s}-val.counts.jsonl", "v", val_c, P=5))
    report = run_analyze(tests, tmp_path / "out", labels=["sft", "sft", "rl", "rl"], seeds=["0", "1", "0", "1"],
                         validation=vals, config=AnalysisConfig(num_resamples=50), viewer=False)  # fmt: skip
    assert report["validation_chosen"]["synthetic"]["models"]["rl seed 1"]["chosen_temperature"] == [1.0] * 4
    (pooled,) = [e for e in report["seeds"]["synthetic"] if e["condition"] == "validation-chosen T"]
    assert pooled["pooled"]["mean"][0] == pytest.approx(0.5)  # pass@1 3/4 - 1/4 on every problem and seed


def test_a_stray_comma_in_seeds_is_an_error_naming_the_flag(tmp_path, capsys) -> None:
    run = _eval_dir(tmp_path / "a", "a", "t", {1.0: 1}, P=2)
    assert main(["analyze", run, run, "--seeds", "0,,1", "--out", str(tmp_path / "out"), "--no-viewer"]) == 2
    assert "--seeds '0,,1' has an empty item" in capsys.readouterr().err
