"""A prompt that cannot fit the model's positions with its response budget is an error naming the row, up front."""

import json
import time

import pytest

from conftest import make_agent
from tirl.data.records import problem_rows
from tirl.eval.evaluate import EvalConfig, evaluate
from tirl.tasks.arith.problems import generate_problems


def _rows(long_row: int, words: int) -> list[dict]:
    rows = [p.to_row() for p in generate_problems(3, seed=0)]
    rows[long_row]["prompt"] = [{"role": "user", "content": "add " * words}]
    return rows


def test_a_prompt_past_the_models_positions_is_named_before_sampling(model, renderer, sandbox):
    agent = make_agent(model, renderer, sandbox, max_tokens=8)
    assert model.config.max_position_embeddings == 1024
    rows = _rows(1, 1100)
    n = len(renderer.prompt_ids(rows[1]["prompt"]))
    assert n + 8 > 1024
    with pytest.raises(ValueError) as e:
        evaluate(agent, rows, EvalConfig(n=1), model_label="m", seed=0)
    pid = problem_rows(rows)[1].problem_id
    assert f"eval row 2 (tirl/arith problem {pid}) has a {n}-token prompt" in str(e.value)
    assert f"it can reach {n + 8} tokens, past the model's 1024 positions (max_position_embeddings)" in str(
        e.value
    )


def test_a_prompt_that_leaves_room_for_the_response_runs(model, renderer, sandbox):
    """The limit is the positions less the response budget: the same prompt fits with a smaller budget."""
    rows = _rows(0, 250)  # 1,008 tokens: room for a 16-token response
    n = len(renderer.prompt_ids(rows[0]["prompt"]))
    agent = make_agent(model, renderer, sandbox, max_tokens=1024 - n)
    records, _ = evaluate(agent, rows[:1], EvalConfig(n=1), model_label="m", seed=0)
    assert len(records) == 1
    with pytest.raises(ValueError, match=f"eval row 1 .* has a {n}-token prompt"):
        evaluate(
            make_agent(model, renderer, sandbox, max_tokens=1025 - n),
            rows[:1],
            EvalConfig(n=1),
            model_label="m",
            seed=0,
        )


def test_tirl_eval_refuses_a_1mb_prompt_in_seconds(tokenizer, tmp_path, capsys):
    from conftest import make_model
    from tirl.cli import main

    make_model(tokenizer).save_pretrained(tmp_path / "m")
    tokenizer.save_pretrained(tmp_path / "m")
    rows = _rows(2, 250_000)  # 1 MB of text
    data = tmp_path / "test.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    start = time.monotonic()
    args = [f"model.path={tmp_path / 'm'}", f"eval.data={data}", "eval.n=1", "agent.max_response_tokens=8"]
    assert main(["eval", *args, "--out", str(tmp_path / "e")]) == 2
    assert time.monotonic() - start < 60
    err = capsys.readouterr().err
    assert "eval row 3 (" in err and "past the model's 1024 positions" in err


def test_rl_checks_its_rows_the_same_way_after_max_prompt_tokens(
    model, tokenizer, renderer, sandbox, tmp_path
):
    """rl.data with agent.max_prompt_tokens=0 (no filter): a prompt past the positions is named at start-up."""
    from tirl.rewards.shaping import RewardConfig
    from tirl.rollout.sampling import SamplingParams
    from tirl.train.rl.run import assemble
    from tirl.train.rl.trainer import RLConfig, RLTrainer

    short = {"prompt": [{"role": "user", "content": "2 * 3?"}], "reward_model": {"ground_truth": "6"}}
    long = {"prompt": [{"role": "user", "content": "add " * 200}], "reward_model": {"ground_truth": "6"}}
    n = len(renderer.prompt_ids(long["prompt"]))
    agent = make_agent(model, renderer, sandbox, max_tokens=1025 - n)
    kw = dict(sampling=SamplingParams(), reward=RewardConfig(), out_dir=tmp_path, seed=0)
    cfg = RLConfig(steps=1, prompts_per_step=1, n=2, mini_batch_size=2)
    with pytest.raises(
        ValueError, match=f"rl.data row 2 .* has a {n}-token prompt: .* past the model's 1024"
    ):
        RLTrainer(assemble(model, tokenizer, agent, [short, long], cfg, **kw))
    agent.config.max_prompt_tokens = n - 1  # dropped as verl's filter_overlong_prompts does, then all fit
    assert len(RLTrainer(assemble(model, tokenizer, agent, [short, long], cfg, **kw)).run.rows) == 1
