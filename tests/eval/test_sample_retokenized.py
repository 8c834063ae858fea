"""`tirl data sample --keep-retokenized`: a correct sample whose ids are not the tokenizer's own split of its text is
kept as that text (SFT re-tokenizes it); any other token-check failure is still dropped."""

from __future__ import annotations

import json

import pytest
from test_sample import PROBLEMS, ScriptedEngine, run

from conftest import make_model
from tirl.cli import main
from tirl.commands.tokcheck import check_tokens_command
from tirl.data import read_rows
from tirl.eval.rejection_sampling import SampleConfig, sample_rows, summary_path
from tirl.rewards.shaping import RewardConfig
from tirl.rollout.agent.loop import AgentConfig, AgentLoop
from tirl.rollout.sampling import SamplingParams


@pytest.fixture()
def model_dir(tokenizer, tmp_path):
    make_model(tokenizer).save_pretrained(tmp_path / "m")
    tokenizer.save_pretrained(tmp_path / "m")
    return tmp_path / "m"


def test_a_noncanonical_sample_is_kept_as_its_text(renderer, sandbox):
    # each problem: the non-canonical sample first (script 5), then a clean one with other text (script 4)
    rows, st = run(renderer, sandbox, SampleConfig(n=2, keep=2, keep_retokenized=True), only=[5, 4])
    assert (st.correct, st.kept, st.retokenized, st.token_check_failed) == (6, 6, 3, 0)
    assert [r["sample"] for r in rows] == [0, 1] * 3
    assert [r.get("retokenized", False) for r in rows] == [True, False] * 3
    good, _ = run(renderer, sandbox, SampleConfig(n=1), only=[1])  # the same text, sampled canonically
    for kept, canonical in zip(rows[::2], good, strict=True):
        assert kept["messages"] == canonical["messages"]  # the row is the text, whatever ids the model drew
    assert st.summary()["retokenized"] == 3


def test_without_the_flag_the_same_samples_are_dropped(renderer, sandbox):
    rows, st = run(renderer, sandbox, SampleConfig(n=2, keep=2), only=[5, 4])
    assert (st.kept, st.retokenized, st.token_check_failed) == (3, 0, 3)
    assert all("retokenized" not in r for r in rows)


def test_a_row_of_other_text_is_dropped_even_with_the_flag(renderer, sandbox):
    # verl's token stream puts no newline before a tool turn: the chat template's rendering is other text
    agent_cfg = AgentConfig(token_stream="verl")
    agent = AgentLoop(ScriptedEngine(renderer, PROBLEMS, only=[1]), renderer, sandbox, agent_cfg)
    cfg = SampleConfig(n=1, keep_retokenized=True)
    rows, st = sample_rows(
        agent, [p.to_row() for p in PROBLEMS], cfg, params=SamplingParams(), reward=RewardConfig(), seed=0
    )
    assert (st.correct, st.kept, st.retokenized, st.token_check_failed) == (3, 0, 0, 3)


def test_cli_keeps_retokenized_rows_and_counts_them(model_dir, tmp_path, monkeypatch, capsys):
    from tirl.rollout import factory

    def scripted_agent(ro, agent_cfg, *, renderer, sandbox, tools, **_):
        engine = ScriptedEngine(renderer, PROBLEMS, only=[5, 4])
        return AgentLoop(engine, renderer, sandbox, agent_cfg, tools=tools)

    monkeypatch.setattr(factory, "build_agent", scripted_agent)
    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps(p.to_row()) + "\n" for p in PROBLEMS))
    out = tmp_path / "s.jsonl"
    args = ["data", "sample", f"model.path={model_dir}", "--data", str(data), "--out", str(out), "--n", "2"]
    assert main([*args, "--keep", "2", "--keep-retokenized"]) == 0
    assert "3 of the kept rows are kept as text" in capsys.readouterr().out
    summary = json.loads(summary_path(out).read_text())
    assert (summary["kept"], summary["retokenized"], summary["token_check_failed"]) == (6, 3, 0)
    assert summary["settings"]["keep_retokenized"] is True and len(read_rows(out)) == 6
    # the written file is what SFT trains on: its rendering is the tokenizer's own split of the text
    assert check_tokens_command(str(out), model=str(model_dir), fmt=None, config=None, data=None) == 0
