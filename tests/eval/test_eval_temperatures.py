"""`evaluate` at several temperatures in one call: records per temperature, summaries never pooled across them."""

import pytest

from conftest import make_agent
from tirl.eval.analysis import analyze_runs
from tirl.eval.evaluate import EvalConfig, evaluate, summarize_records, write_eval
from tirl.eval.samples import load_run
from tirl.eval.tables import AnalysisConfig
from tirl.tasks.arith.problems import generate_problems


def test_several_temperatures_in_one_call(model, renderer, sandbox, tmp_path) -> None:
    rows = [p.to_row() for p in generate_problems(3, seed=1)]
    cfg = EvalConfig(n=2, temperatures=[0.5, 1.0])
    agent = make_agent(model, renderer, sandbox, max_tokens=12)
    records, trajs = evaluate(agent, rows, cfg, model_label="m", seed=0)
    assert len(records) == len(trajs) == 2 * 3 * 2
    assert [r.temperature for r in records] == [0.5] * 6 + [1.0] * 6
    assert all(t.temperature == r.temperature for r, t in zip(records, trajs))
    summary = summarize_records(records)
    assert set(summary) == {"tirl/arith T=0.5", "tirl/arith T=1"}
    assert all(s["samples_per_problem"] == 2 for s in summary.values())
    write_eval(tmp_path, records, trajs, summary)
    report = analyze_runs([load_run(tmp_path)], AnalysisConfig(num_resamples=20))
    model_entry = report["sources"]["tirl/arith"]["models"]["m"]
    assert set(model_entry["temperatures"]) == {"0.5", "1"} and "envelope" in model_entry


def test_eval_config_validation() -> None:
    assert EvalConfig(temperature=0.7).all_temperatures == [0.7]
    with pytest.raises(ValueError, match="duplicates"):
        EvalConfig(temperatures=[1.0, 1.0])
    with pytest.raises(ValueError, match=">= 0"):
        EvalConfig(temperatures=[-1.0])
