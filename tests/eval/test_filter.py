"""`tirl data filter`: k samples per problem through the real agent loop and sandbox, with a scripted engine that
plants each problem's pass rate; the band's ends, the rows written (the input rows plus extra_info.filter) and the
summary, and every argument refused before any sampling."""

from __future__ import annotations

import json
import math

import pytest
from test_sample import PROBLEMS, ScriptedEngine, scripts

from conftest import make_model
from tirl.cli import main
from tirl.data import read_rows
from tirl.data.records import read_problems
from tirl.eval.pass_rate_filter import Band, filtered_rows
from tirl.eval.rejection_sampling import summary_path
from tirl.rewards.shaping import RewardConfig
from tirl.rollout.agent.loop import AgentConfig, AgentLoop
from tirl.rollout.sampling import SamplingParams

# the scripts each problem's samples cycle through (test_sample.scripts: 0 is wrong, 1 correct): with k = 4,
# problem 0 is never solved, problem 1 half the time, problem 2 always
PLAN = [[0], [0, 1], [1]]


@pytest.fixture()
def model_dir(tokenizer, tmp_path):
    make_model(tokenizer).save_pretrained(tmp_path / "m")
    tokenizer.save_pretrained(tmp_path / "m")
    return tmp_path / "m"


def planted(renderer) -> ScriptedEngine:
    engine = ScriptedEngine(renderer, PROBLEMS)
    for p, picks in zip(PROBLEMS, PLAN, strict=True):
        engine.by_prompt[tuple(renderer.prompt_ids(p.to_row()["prompt"]))] = [scripts(p)[k] for k in picks]
    return engine


def test_the_default_band_excludes_both_ends():
    band = Band()
    assert str(band) == "(0, 1)"
    assert [band.contains(r) for r in (0.0, 1 / 8, 0.5, 7 / 8, 1.0)] == [False, True, True, True, False]


def test_an_inclusive_band_keeps_its_ends():
    band = Band(0.25, 0.75, inclusive=True)
    assert str(band) == "[0.25, 0.75]"
    assert [band.contains(r) for r in (0.125, 0.25, 0.5, 0.75, 0.875)] == [False, True, True, True, False]
    assert Band(0.0, 0.0, inclusive=True).contains(0.0)  # the never-solved problems


@pytest.mark.parametrize(
    ("band", "said"),
    [
        (dict(min_rate=0.8, max_rate=0.2), "the band (0.8, 0.2) is empty"),
        (dict(min_rate=0.5, max_rate=0.5), "the band (0.5, 0.5) is empty"),
        (dict(min_rate=-0.1), "--min-rate=-0.1 must be a finite number with 0.0 <= --min-rate <= 1.0"),
        (dict(max_rate=math.nan), "--max-rate=nan must be a finite number"),
    ],
)
def test_bad_bands_are_refused(band, said):
    with pytest.raises(ValueError, match=said.replace("(", r"\(").replace(")", r"\)")):
        Band(**band)


def test_a_band_without_a_reachable_rate_is_refused():
    Band(0.2, 0.3).check_k(4)  # 0.25
    with pytest.raises(ValueError, match=r"with --k 2 a pass rate is j/2, and none lies in \(0.6, 0.9\)"):
        Band(0.6, 0.9).check_k(2)


def test_problems_in_the_band_are_kept_with_their_rates(renderer, sandbox):
    agent = AgentLoop(planted(renderer), renderer, sandbox, AgentConfig())
    rows = [p.to_row() for p in PROBLEMS]
    kept, st = filtered_rows(
        agent, rows, Band(), 4, params=SamplingParams(), reward=RewardConfig(), seed=0, batch_problems=2
    )
    assert (st.problems, st.never, st.sometimes, st.always, st.kept) == (3, 1, 1, 1, 1)
    assert st.pass_rates == {PROBLEMS[0].id: 0.0, PROBLEMS[1].id: 0.5, PROBLEMS[2].id: 1.0}
    assert st.correct_counts == {0: 1, 2: 1, 4: 1}
    info = {**rows[1]["extra_info"], "filter": {"pass_rate": 0.5, "correct": 2, "k": 4}}
    assert kept == [{**rows[1], "extra_info": info}]  # the input row, the filter's field beside its own


def _args(model_dir, tmp_path, out, *more) -> list[str]:
    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps(p.to_row()) + "\n" for p in PROBLEMS))
    return ["data", "filter", f"model.path={model_dir}", "--data", str(data), "--out", str(out), *more]


def _planted_agent(ro, agent_cfg, *, renderer, sandbox, tools, **_):
    return AgentLoop(planted(renderer), renderer, sandbox, agent_cfg, tools=tools)


def test_cli_writes_rl_rows_and_the_summary(model_dir, tmp_path, monkeypatch, capsys):
    from tirl.rollout import factory

    monkeypatch.setattr(factory, "build_agent", _planted_agent)
    out = tmp_path / "f.jsonl"
    assert main(_args(model_dir, tmp_path, out, "--k", "4")) == 0
    assert "never solved 1, sometimes 1, always 1" in capsys.readouterr().out
    (row,) = read_rows(out, kind="rl")
    assert row["extra_info"]["filter"] == {"pass_rate": 0.5, "correct": 2, "k": 4}
    assert [p.problem_id for p in read_problems(out)] == [PROBLEMS[1].id]  # what `tirl rl` reads as rl.data
    summary = json.loads(summary_path(out).read_text())
    assert (summary["never"], summary["sometimes"], summary["always"], summary["kept"]) == (1, 1, 1, 1)
    assert summary["k"] == 4 and summary["band"] == "(0, 1)" and summary["pass_rates"][PROBLEMS[2].id] == 1.0
    settings = summary["settings"]
    assert settings["model"] == str(model_dir) and settings["seed"] == 0 and settings["inclusive"] is False

    wide = tmp_path / "w.parquet"
    assert main(_args(model_dir, tmp_path, wide, "--k", "4", "--min-rate", "0.5", "--inclusive")) == 0
    rates = [r["extra_info"]["filter"]["pass_rate"] for r in read_rows(wide)]
    assert rates == [0.5, 1.0]


def _never_sample(*_, **__):
    raise AssertionError("sampled although an argument was bad")


@pytest.mark.parametrize(
    ("more", "said"),
    [
        (["--min-rate", "0.8", "--max-rate", "0.2"], "the band (0.8, 0.2) is empty"),
        (["--k", "2", "--min-rate", "0.6", "--max-rate", "0.9"], "with --k 2 a pass rate is j/2"),
        (["--k", "0"], "--k must be >= 1, got 0"),
    ],
)
def test_bad_arguments_are_refused_before_any_sampling(model_dir, tmp_path, monkeypatch, capsys, more, said):
    from tirl.rollout import factory

    monkeypatch.setattr(factory, "build_agent", _never_sample)
    out = tmp_path / "f.jsonl"
    assert main(_args(model_dir, tmp_path, out, *more)) == 2
    assert said in capsys.readouterr().err and not out.exists()


def test_existing_outputs_and_bad_suffixes_are_refused_before_any_sampling(
    model_dir, tmp_path, monkeypatch, capsys
):
    from tirl.rollout import factory

    monkeypatch.setattr(factory, "build_agent", _never_sample)
    out = tmp_path / "f.jsonl"
    out.write_text("mine\n")
    assert main(_args(model_dir, tmp_path, out)) == 2
    assert "already exists" in capsys.readouterr().err and out.read_text() == "mine\n"
    summary_path(tmp_path / "g.jsonl").write_text("notes\n")
    assert main(_args(model_dir, tmp_path, tmp_path / "g.jsonl")) == 2
    assert "(the summary of --out" in capsys.readouterr().err
    assert main(_args(model_dir, tmp_path, tmp_path / "f.csv")) == 2
    assert "cannot write rows as .csv" in capsys.readouterr().err
