"""The reasoning-mode section of `tirl analyze` on synthetic records with a planted relation between tool calls
and correctness, whose numbers are worked out by hand."""

from __future__ import annotations

import pytest

from tirl.eval.analysis import analyze_runs
from tirl.eval.evaluate import SampleRecord
from tirl.eval.reasoning_mode import bucket, reasoning_mode
from tirl.eval.report import print_summary
from tirl.eval.samples import Run, Sample
from tirl.eval.tables import AnalysisConfig

P = 30  # problems
N = 10  # samples per problem


def records(calls_of, *, temperature: float = 1.0) -> list[SampleRecord]:
    """Problem i has i % (N + 1) correct samples of N; a sample's tool calls are calls_of(correct, j), j its index
    among the problem's correct (or wrong) samples."""
    out = []
    for i in range(P):
        c = i % (N + 1)
        for k in range(N):
            ok = k < c
            out.append(SampleRecord("m", f"q{i:02d}", "synthetic", k, temperature, 1.0, ok, float(ok), "1",
                                    calls_of(ok, k if ok else k - c), 0, 2, 10, "answer"))  # fmt: skip
    return out


def test_planted_fewer_calls_when_correct_is_found_with_an_interval_below_zero():
    rm = reasoning_mode(records(lambda ok, k: 1 if ok else 3), num_resamples=200)
    # correct answers: 1 call, wrong ones: 3 calls; every problem with 1..9 correct of 10 pairs -2 exactly
    mixed = sum(1 for i in range(P) if 0 < i % (N + 1) < N)
    w = rm["within_problem"]
    assert w["problems"] == mixed == 25
    assert (w["difference"], w["lo"], w["hi"]) == (-2.0, -2.0, -2.0)
    assert w["fewer_when_correct"] == 25 and w["more_when_correct"] == 0
    b = rm["by_calls"]
    assert b["1"]["accuracy"] == 1.0 and b["3+"]["accuracy"] == 0.0 and b["0"]["samples"] == 0
    correct = sum(i % (N + 1) for i in range(P))
    assert b["1"]["samples"] == correct and b["3+"]["samples"] == P * N - correct
    assert rm["verdict"].split("; ")[1].startswith("fewer calls go with correct answers")
    assert "-2.00 calls" in rm["verdict"]


def test_planted_more_calls_when_correct_reads_the_other_way():
    rm = reasoning_mode(records(lambda ok, k: 2 if ok else 1), num_resamples=200)
    assert rm["within_problem"]["difference"] == 1.0
    assert "more calls go with correct answers" in rm["verdict"]


def test_calls_unrelated_to_correctness_show_no_relation():
    # correct and wrong answers alike alternate 1, 2, 1, ... calls: the difference per problem is 0 where c is even,
    # -0.44 (c = 1, three problems), -0.10 (3, three), +0.10 (7, three), +0.44 (9, two): mean -0.44 / 25
    rm = reasoning_mode(records(lambda ok, j: 1 + j % 2), num_resamples=200)
    w = rm["within_problem"]
    assert w["difference"] == pytest.approx(-4 / 9 / 25)
    assert w["lo"] < 0 < w["hi"]
    assert "no relation shown" in rm["verdict"]


def test_one_call_per_answer_cannot_be_tested():
    rm = reasoning_mode(records(lambda ok, k: 1), num_resamples=200)
    assert rm["calls"] == {"1": P * N}
    assert (
        "cannot be tested: every answer that calls the tool makes exactly 1 call (the task takes one call)"
        in (rm["verdict"])
    )
    # answers without a call beside them do not make it testable: the claim is about tool-using answers
    rm = reasoning_mode(records(lambda ok, j: 1 if ok else j % 2), num_resamples=200)
    assert "exactly 1 call" in rm["verdict"] and rm["by_calls"]["0"]["accuracy"] == 0.0
    assert rm["within_problem_all"]["difference"] > 0  # over all answers, the correct ones (1 call) make more


def test_accuracy_interval_draws_problems_and_holds_the_estimate():
    rm = reasoning_mode(records(lambda ok, j: 1 + j % 2), num_resamples=500)
    for b in (rm["by_calls"]["1"], rm["by_calls"]["2"]):
        assert b["problems"] == P and b["lo"] <= b["accuracy"] <= b["hi"] and b["hi"] - b["lo"] > 0
    assert [bucket(c) for c in (0, 1, 2, 3, 7)] == [0, 1, 2, 3, 3]
    assert reasoning_mode([])["verdict"] == "no samples"


def test_temperatures_are_separate_problems():
    # the same problem at two temperatures: correct at T=0.6 with 1 call, wrong at T=1 with 3: never paired
    recs = [SampleRecord("m", "q", "s", k, t, 1.0, t == 0.6, 1.0, "1", 1 if t == 0.6 else 3, 0, 2, 10, "answer")
            for t in (0.6, 1.0) for k in range(4)]  # fmt: skip
    rm = reasoning_mode(recs, num_resamples=100)
    assert rm["problems"] == 2 and rm["within_problem"]["problems"] == 0
    assert "cannot be tested within problems" in rm["verdict"]


@pytest.mark.parametrize("label", ["a"])
def test_analyze_reports_the_section_and_prints_its_line(label, tmp_path, capsys):
    run = Run(label, "/synthetic", "tirl", [Sample(r) for r in records(lambda ok, k: 1 if ok else 3)])
    report = analyze_runs([run], AnalysisConfig(num_resamples=100))
    assert report["reasoning_mode"][label]["within_problem"]["difference"] == -2.0
    report["findings"], report["sources"], report["audit"] = [], {}, {}
    print_summary(report, tmp_path)
    assert f"reasoning mode {label}: accuracy by tool calls" in capsys.readouterr().out
