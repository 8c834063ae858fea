"""`tirl data sample`: rejection sampling through the real agent loop and sandbox, with a scripted engine whose
samples are known to be right, wrong, duplicated, tool-free or non-canonically tokenized."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import make_model
from tirl.cli import main
from tirl.commands.tokcheck import check_tokens_command
from tirl.data import read_rows
from tirl.data.records import ProblemRow
from tirl.eval.rejection_sampling import SampleConfig, sample_rows, summary_path
from tirl.rewards.shaping import RewardConfig
from tirl.rollout.agent.loop import AgentConfig, AgentLoop
from tirl.rollout.engines.base import RemoteModel
from tirl.rollout.engines.torch.engine import Generation
from tirl.rollout.sampling import SamplingParams
from tirl.rollout.types import Origin
from tirl.tasks.arith.problems import generate_problems
from tirl.tools.code_interpreter import tool_call_json
from tirl.train.sft import render_rows


def call(code: str, preamble: str = "Let me run it.") -> str:
    return f"{preamble}\n<tool_call>\n{tool_call_json(code)}\n</tool_call>"


def scripts(p) -> list[dict]:
    """The samples of problem `p`, in sample order (sample k of a problem gets script k % len)."""
    good = [call(f"print({p.expression})"), f"The answer is \\boxed{{{p.answer}}}."]
    return [
        {"turns": [call(f"print({p.expression})", "Try."), "The answer is \\boxed{-1}."]},  # wrong
        {"turns": good},  # correct, with the tool
        {"turns": good},  # its duplicate
        {"turns": [f"The answer is \\boxed{{{p.answer}}}."]},  # correct, no tool
        {"turns": [call(f"x = {p.expression}\nprint(x)", "Compute."), good[1]]},  # correct, other text
        {"turns": good, "noncanonical": True},  # correct, but sampled as a non-canonical token split
    ]


class ScriptedEngine(RemoteModel):
    """Sample k of each prompt follows script k (or, with `pick`, a script drawn from the generator); later turns
    are found by the context they continue."""

    def __init__(self, renderer, problems, pick: bool = False, only: list[int] | None = None):
        self.renderer, self.pick = renderer, pick
        self.by_prompt = {}
        for p in problems:
            options = scripts(p)
            self.by_prompt[tuple(renderer.prompt_ids(p.to_row()["prompt"]))] = [
                options[k] for k in only or range(6)
            ]
        self.started: dict[tuple, int] = {}
        self.live: dict[tuple, list] = {}  # context so far -> [(script, next turn)] (duplicates share one)

    def generate(self, prompts, params, *, max_new_tokens=None, generator=None, seeds=None):
        out = []
        for ctx in prompts:
            ctx = tuple(ctx)
            if ctx in self.by_prompt:
                k = self.started.get(ctx, 0)
                self.started[ctx] = k + 1
                options = self.by_prompt[ctx]
                if self.pick:
                    k = int(torch.randint(len(options), (1,), generator=generator))
                script, turn = options[k % len(options)], 0
            else:
                key = max((c for c, left in self.live.items() if left and ctx[: len(c)] == c), key=len)
                script, turn = self.live[key].pop()
            ids = self._ids(script["turns"][turn], script.get("noncanonical", False))
            self.live.setdefault(ctx + tuple(ids), []).append((script, turn + 1))
            reason = "stop" if ids[-1] == self.renderer.tool_call_end_id else "eos"
            out.append(Generation(ids, [-0.5] * len(ids), reason))
        return out

    def _ids(self, text: str, noncanonical: bool) -> list[int]:
        ids = self.renderer.encode(text)
        if noncanonical:  # the first multi-character token, spelled one character at a time
            i = next(i for i, t in enumerate(ids) if len(self.renderer.tokenizer.decode([t])) > 1)
            ids = (
                ids[:i]
                + [x for ch in self.renderer.tokenizer.decode([ids[i]]) for x in self.renderer.encode(ch)]
                + ids[i + 1 :]
            )
        return ids if ids[-1] == self.renderer.tool_call_end_id else ids + [self.renderer.eos_id]

    def close(self):
        pass


PROBLEMS = generate_problems(3, seed=5)


def run(renderer, sandbox, cfg: SampleConfig, *, pick=False, seed=0, only=None):
    agent = AgentLoop(ScriptedEngine(renderer, PROBLEMS, pick, only), renderer, sandbox, AgentConfig())
    rows = [p.to_row() for p in PROBLEMS]
    return sample_rows(
        agent, rows, cfg, params=SamplingParams(), reward=RewardConfig(), seed=seed, batch_problems=2
    )


def test_counts_cap_and_token_check(renderer, sandbox):
    rows, st = run(renderer, sandbox, SampleConfig(n=6, keep=1))
    assert (st.problems, st.samples, st.correct) == (3, 18, 15)
    assert (st.kept, st.no_tool, st.duplicates, st.over_keep, st.token_check_failed) == (3, 3, 6, 3, 0)
    assert set(st.kept_per_problem.values()) == {1} and st.summary()["problems_with_kept"] == 3
    assert [r["sample"] for r in rows] == [1, 1, 1]  # the first correct distinct sample of each problem
    m = rows[0]["messages"]
    assert [x["role"] for x in m] == ["user", "assistant", "tool", "assistant"]
    p = PROBLEMS[0]
    assert m[1]["tool_calls"][0]["function"]["arguments"] == {"code": f"print({p.expression})"}
    assert m[2]["content"] == f"{p.answer}\n"  # the sandbox's output, as the model saw it
    assert m[3]["content"] == f"The answer is \\boxed{{{p.answer}}}."


def test_keep_more_and_no_tool_rows(renderer, sandbox):
    rows, st = run(renderer, sandbox, SampleConfig(n=6, keep=3, require_tool=False))
    # samples 1, 3, 4 kept; 5 duplicates 1's text, so is dropped as a duplicate before its token check
    assert (st.kept, st.no_tool, st.duplicates, st.over_keep) == (9, 0, 6, 0)
    assert [r["sample"] for r in rows[:3]] == [1, 3, 4]
    assert "tool_calls" not in rows[1]["messages"][1]


def test_noncanonical_sample_fails_the_token_check(renderer, sandbox):
    # each problem: the non-canonical sample first, then a clean one with other text
    rows, st = run(renderer, sandbox, SampleConfig(n=2, keep=2), only=[5, 4])
    assert (st.correct, st.token_check_failed, st.kept, st.duplicates) == (6, 3, 3, 0)
    assert [r["sample"] for r in rows] == [1, 1, 1]
    assert "ids divergence" in st.failures[0] and len(st.failures) == 3


def test_same_seed_same_rows(renderer, sandbox):
    cfg = SampleConfig(n=4, keep=2, require_tool=False)
    a, sa = run(renderer, sandbox, cfg, pick=True, seed=3)
    b, sb = run(renderer, sandbox, cfg, pick=True, seed=3)
    c, sc = run(renderer, sandbox, cfg, pick=True, seed=4)
    assert a == b and sa == sb
    assert (a, sa) != (c, sc)  # the seed does steer the samples


def test_rows_load_as_sft_data(renderer, sandbox, tmp_path):
    from tirl.data import write_rows

    rows, _ = run(renderer, sandbox, SampleConfig(n=6, keep=2))
    path = write_rows(tmp_path / "s.jsonl", rows)
    loaded = read_rows(path)
    rendered = render_rows(loaded, renderer, max_length=4096, source=str(path))
    assert len(rendered) == len(rows) == 6 and all(sum(m) > 0 for _, m in rendered)


@pytest.fixture()
def model_dir(tokenizer, tmp_path):
    make_model(tokenizer).save_pretrained(tmp_path / "m")
    tokenizer.save_pretrained(tmp_path / "m")
    return tmp_path / "m"


def test_cli_end_to_end(model_dir, tmp_path, monkeypatch, capsys):
    from tirl.rollout import factory

    def scripted_agent(ro, agent_cfg, *, renderer, sandbox, tools, **_):
        return AgentLoop(ScriptedEngine(renderer, PROBLEMS), renderer, sandbox, agent_cfg, tools=tools)

    monkeypatch.setattr(factory, "build_agent", scripted_agent)
    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps(p.to_row()) + "\n" for p in PROBLEMS))
    out = tmp_path / "sampled.jsonl"
    args = ["data", "sample", f"model.path={model_dir}", "--data", str(data), "--out", str(out), "--n", "6"]
    assert main(args) == 0
    summary = json.loads(summary_path(out).read_text())
    assert summary["kept"] == 3 and summary["settings"]["n"] == 6 and summary["wall_s"] >= 0
    assert check_tokens_command(str(out), model=str(model_dir), fmt=None, config=None, data=None) == 0
    first = out.read_text()
    assert main(args) == 2  # exists: refused
    assert "already exists" in capsys.readouterr().err
    assert main([*args, "--force"]) == 0 and out.read_text() == first  # same seed, same file


def test_token_check_compares_the_mask(renderer, sandbox):
    from tirl.eval.rejection_sampling import sft_row_divergence, trajectory_messages

    agent = AgentLoop(ScriptedEngine(renderer, PROBLEMS, only=[1]), renderer, sandbox, AgentConfig())
    problem = ProblemRow.from_row(PROBLEMS[0].to_row(), 0)
    (t,) = agent.run([problem.prompt], SamplingParams(), origins=[Origin(problem)])
    row = {"messages": trajectory_messages(t, renderer), "tools": renderer.tools}
    assert sft_row_divergence(renderer, row, t, 1) is None
    first_tool = t.loss_mask.index(0) + 2  # a token of the tool turn (after the closing <|im_end|> and "\n")
    t.loss_mask[first_tool] = 1
    d = sft_row_divergence(renderer, row, t, 1)
    assert d is not None and d.what == "mask" and d.index == len(t.prompt_ids) + first_tool


def test_cli_prints_token_check_drops(model_dir, tmp_path, monkeypatch, capsys):
    from tirl.rollout import factory

    def scripted_agent(ro, agent_cfg, *, renderer, sandbox, tools, **_):
        engine = ScriptedEngine(renderer, PROBLEMS, only=[5, 4])
        return AgentLoop(engine, renderer, sandbox, agent_cfg, tools=tools)

    monkeypatch.setattr(factory, "build_agent", scripted_agent)
    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps(p.to_row()) + "\n" for p in PROBLEMS))
    out = tmp_path / "s.parquet"
    assert (
        main(
            ["data", "sample", f"model.path={model_dir}", "--data", str(data), "--out", str(out), "--n", "2"]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "token check: 3 rows dropped" in printed and "ids divergence" in printed
    assert json.loads(summary_path(out).read_text())["token_check_failed"] == 3 and len(read_rows(out)) == 3


def _sample_args(model_dir, tmp_path, out) -> list[str]:
    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps(p.to_row()) + "\n" for p in PROBLEMS))
    return ["data", "sample", f"model.path={model_dir}", "--data", str(data), "--out", str(out)]


def _never_sample(*_, **__):
    raise AssertionError("sampled although an argument was bad")


def test_an_existing_summary_is_refused_before_any_sampling(model_dir, tmp_path, monkeypatch, capsys):
    from tirl.rollout import factory

    monkeypatch.setattr(factory, "build_agent", _never_sample)
    out = tmp_path / "s.jsonl"
    summary_path(out).write_text("my notes\n")
    assert main(_sample_args(model_dir, tmp_path, out)) == 2
    said = f"{summary_path(out)} (the summary of --out {out}) already exists: pass --force"
    assert said in capsys.readouterr().err
    assert summary_path(out).read_text() == "my notes\n" and not out.exists()


def test_jsonl_and_parquet_outputs_have_summaries_of_their_own(tmp_path):
    assert summary_path(tmp_path / "s.jsonl") == tmp_path / "s.jsonl.summary.json"
    assert summary_path(tmp_path / "s.parquet") == tmp_path / "s.parquet.summary.json"


def test_an_out_without_a_rows_suffix_is_refused_before_any_sampling(
    model_dir, tmp_path, monkeypatch, capsys
):
    from tirl.rollout import factory

    monkeypatch.setattr(factory, "build_agent", _never_sample)
    out = tmp_path / "nosuffix"
    assert main(_sample_args(model_dir, tmp_path, out)) == 2
    assert f"--out {out}: cannot write rows as a file without a suffix" in capsys.readouterr().err


def test_engine_logs_stay_out_of_the_data_directory(model_dir, tmp_path, monkeypatch):
    from tirl.rollout import factory

    def scripted_agent(ro, agent_cfg, *, renderer, sandbox, tools, work_dir, **_):
        (work_dir / "vllm").mkdir(parents=True)  # what a server engine writes there
        (work_dir / "vllm" / "vllm-server.log").write_text("started\n")
        return AgentLoop(ScriptedEngine(renderer, PROBLEMS), renderer, sandbox, agent_cfg, tools=tools)

    monkeypatch.setattr(factory, "build_agent", scripted_agent)
    data_dir = tmp_path / "d"
    data_dir.mkdir()
    (data_dir / "train.jsonl").write_text("mine\n")
    out = data_dir / "s.jsonl"
    assert main(_sample_args(model_dir, tmp_path, out)) == 0
    names = sorted(p.name for p in data_dir.iterdir())
    assert names == ["s.jsonl", "s.jsonl.engine", "s.jsonl.summary.json", "train.jsonl"]
    assert (data_dir / "s.jsonl.engine" / "vllm" / "vllm-server.log").read_text() == "started\n"
