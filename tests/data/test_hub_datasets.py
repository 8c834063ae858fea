"""`tirl data prepare open-agentrl-*` (`tirl.data.hub`) against fake dataset repositories this test builds in the
Hub cache's own layout, with the recipe's parquet schemas, downloads off: rows converted and read back, the fetched
file's sha256 and commit recorded beside the output, a revision chosen, a missing repository refused with the
command that fetches it, and the recipe configs' header commands writing the files the configs read."""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from hubcache import offline_cache, put_repo
from tirl.cli import main
from tirl.data import read_rows
from tirl.data.benchmarks import MATH_PROMPT_1
from tirl.data.hub import HUB_SETS, RL_30K_COMMIT, SFT_3K_COMMIT

CONFIGS = Path(__file__).resolve().parents[2] / "src" / "tirl" / "configs"
EVAL_COMMIT = "e" * 40
CODE = '{"inputs": ["1\\n"], "outputs": ["1\\n"]}'

RL = [
    {"data_source": "math_dapo", "prompt": [{"role": "user", "content": "What is 1+1?"}], "ability": "MATH",
     "reward_model": {"ground_truth": "2", "style": "rule-lighteval/MATH_v2"},
     "extra_info": {"index": 0, "split": "train"}, "agent_name": "tool_agent"},
    {"data_source": "skywork_code", "prompt": [{"role": "user", "content": "Echo the input."}], "ability": "CODE",
     "reward_model": {"ground_truth": CODE, "style": "rule"}, "extra_info": {"index": 1, "split": "train"},
     "agent_name": "tool_agent"},
]  # fmt: skip
TOOL = {"type": "function", "function": {"name": "code_interpreter", "description": "Run Python code.",
        "parameters": {"type": "object", "properties": {"code": {"type": "string", "description": "the code"}},
                       "required": ["code"]}}}  # fmt: skip
CALL = {"type": "function", "function": {"name": "code_interpreter", "arguments": {"code": "print(12 * 34)"}}}
SFT = [
    {"messages": [{"role": "user", "content": "What is 12 * 34?"},
                  {"role": "assistant", "content": "Let me compute.", "tool_calls": [CALL]},
                  {"role": "tool", "content": "408"},
                  {"role": "assistant", "content": "\\boxed{408}"}], "tools": [TOOL]},
    {"messages": [{"role": "user", "content": "Say 3."}, {"role": "assistant", "content": "\\boxed{3}"}],
     "tools": [TOOL]},
]  # fmt: skip


def _parquet(rows: list[dict]) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(pa.Table.from_pylist(rows), sink)
    return sink.getvalue().to_pybytes()


EVAL = {
    "aime2024/aime_2024_problems.parquet": _parquet(
        [{"data_source": "AIME2024", "Problem": "Find x if x = 25.", "Answer": "025"}]
    ),
    "aime2025/aime_2025_problems.parquet": _parquet(
        [{"data_source": "AIME2025", "problem": "Find y if y = 7.", "answer": 7}]
    ),
    "gpqa-diamond/gpqa_diamond.parquet": _parquet(
        [{"data_source": "gpqa_diamond", "problem": "Which? A) x B) y", "solution": "B", "domain": "Physics"}]
    ),
    "livecodebench-v6/lcb_v6_2502_2505.parquet": _parquet(
        [
            {
                "data_source": "LiveCodeBench_v6",
                "problem": "Echo.",
                "ability": "code",
                "reward_model": json.dumps({"ground_truth": CODE}),
                "extra_info": json.dumps({"idx": 0}),
            }
        ]
    ),  # fmt: skip
}


@pytest.fixture()
def cache(tmp_path, monkeypatch) -> Path:
    """The three Open-AgentRL dataset repositories, offline: SFT-3K and 30K at their pinned commits, Eval at main."""
    c = offline_cache(tmp_path, monkeypatch)
    put_repo(c, "Gen-Verse/Open-AgentRL-SFT-3K", SFT_3K_COMMIT, {"full_sft_3k_shuffled_v4.parquet": _parquet(SFT)},
             repo_type="dataset", ref=None)  # fmt: skip
    put_repo(c, "Gen-Verse/Open-AgentRL-30K", RL_30K_COMMIT, {"Open-AgentRL-30K.parquet": _parquet(RL)},
             repo_type="dataset", ref=None)  # fmt: skip
    put_repo(c, "Gen-Verse/Open-AgentRL-Eval", EVAL_COMMIT, EVAL, repo_type="dataset")
    return c


def _snapshot_file(cache: Path, name: str) -> Path:
    spec = HUB_SETS[name]
    repo = cache / f"datasets--{spec.repo_id.replace('/', '--')}"
    commit = spec.revision if len(spec.revision) == 40 else (repo / "refs" / spec.revision).read_text()
    return repo / "snapshots" / commit / spec.filename


def test_the_30k_file_becomes_rl_rows_with_its_provenance_beside_them(cache, tmp_path):
    out = tmp_path / "rl.parquet"
    assert main(["data", "prepare", "open-agentrl-30k", "--out", str(out)]) == 0
    rows = read_rows(out)
    assert [r["data_source"] for r in rows] == ["math_dapo", "skywork_code"]
    assert [r["prompt"] for r in rows] == [r["prompt"] for r in RL]  # as in the file: rewritten when read
    assert [r["reward_model"] for r in rows] == [r["reward_model"] for r in RL]
    assert [r["extra_info"] for r in rows] == [r["extra_info"] for r in RL]
    record = json.loads((tmp_path / "rl.parquet.source.json").read_text())
    fetched = _snapshot_file(cache, "open-agentrl-30k").read_bytes()
    assert record["repo_id"] == "Gen-Verse/Open-AgentRL-30K" and record["commit"] == RL_30K_COMMIT
    assert record["sha256"] == hashlib.sha256(fetched).hexdigest() and record["bytes"] == len(fetched)
    assert record["output_sha256"] == hashlib.sha256(out.read_bytes()).hexdigest() and record["rows"] == 2


def test_the_sft_file_becomes_sft_rows_with_their_tool_calls_and_schemas(cache, tmp_path, renderer):
    out = tmp_path / "sft.jsonl"
    assert main(["data", "prepare", "open-agentrl-sft-3k", "--out", str(out)]) == 0
    rows = read_rows(out)
    assert rows[0]["messages"][1]["tool_calls"] == [CALL] and rows[0]["tools"] == [TOOL]
    assert [len(r["messages"]) for r in rows] == [4, 2]
    ids, mask = renderer.render(rows[0]["messages"], tools=rows[0]["tools"])
    assert len(ids) == len(mask) and 0 < sum(mask) < len(mask)  # trains on the assistant turns only
    assert json.loads((tmp_path / "sft.jsonl.source.json").read_text())["commit"] == SFT_3K_COMMIT


def test_the_eval_sets_take_the_recipes_wording_and_normalized_answers(cache, tmp_path):
    got = {}
    for name in ("open-agentrl-aime24", "open-agentrl-aime25", "open-agentrl-gpqa", "open-agentrl-lcb-v6"):
        assert main(["data", "prepare", name, "--out", str(tmp_path / f"{name}.jsonl")]) == 0
        [got[name]] = read_rows(tmp_path / f"{name}.jsonl")
    aime24 = got["open-agentrl-aime24"]
    assert aime24["data_source"] == "aime2024" and aime24["reward_model"]["ground_truth"] == "25"
    assert aime24["prompt"][0]["content"].startswith(MATH_PROMPT_1 + "Find x if x = 25.")
    assert got["open-agentrl-aime25"]["reward_model"]["ground_truth"] == "7"
    gpqa = got["open-agentrl-gpqa"]
    assert (gpqa["data_source"], gpqa["ability"], gpqa["reward_model"]["ground_truth"]) == (
        "gpqa_diamond",
        "Physics",
        "B",
    )
    assert "following Physics problem" in gpqa["prompt"][0]["content"]
    assert json.loads(got["open-agentrl-lcb-v6"]["reward_model"]["ground_truth"]) == json.loads(CODE)
    record = json.loads((tmp_path / "open-agentrl-gpqa.jsonl.source.json").read_text())
    assert (record["revision"], record["commit"], record["wording"]) == ("main", EVAL_COMMIT, "recipe")


def test_a_revision_is_fetched_as_asked(cache, tmp_path):
    other = "a" * 40
    put_repo(cache, "Gen-Verse/Open-AgentRL-30K", other, {"Open-AgentRL-30K.parquet": _parquet(RL[:1])},
             repo_type="dataset", ref="v2")  # fmt: skip
    out = tmp_path / "rl.jsonl"
    assert main(["data", "prepare", "open-agentrl-30k", "--out", str(out), "--revision", "v2"]) == 0
    assert len(read_rows(out)) == 1
    record = json.loads((tmp_path / "rl.jsonl.source.json").read_text())
    assert (record["revision"], record["commit"]) == ("v2", other)


def test_a_dataset_not_in_the_cache_offline_is_refused_with_the_fetch_command(tmp_path, monkeypatch, capsys):
    offline_cache(tmp_path, monkeypatch)
    out = tmp_path / "rl.parquet"
    assert main(["data", "prepare", "open-agentrl-30k", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "tirl data prepare open-agentrl-30k: cannot get dataset Gen-Verse/Open-AgentRL-30K" in err
    assert (
        f"hf download Gen-Verse/Open-AgentRL-30K Open-AgentRL-30K.parquet --repo-type dataset --revision "
        f"{RL_30K_COMMIT}"
    ) in " ".join(err.split())
    assert not out.exists() and not list(tmp_path.glob("rl.parquet*"))


def test_a_bad_row_in_the_fetched_file_is_named(tmp_path, monkeypatch, capsys):
    c = offline_cache(tmp_path, monkeypatch)
    bad = [{k: v for k, v in RL[0].items() if k != "prompt"}]
    put_repo(c, "Gen-Verse/Open-AgentRL-30K", RL_30K_COMMIT, {"Open-AgentRL-30K.parquet": _parquet(bad)},
             repo_type="dataset", ref=None)  # fmt: skip
    assert main(["data", "prepare", "open-agentrl-30k", "--out", str(tmp_path / "rl.parquet")]) == 2
    assert "Open-AgentRL-30K.parquet: row 1, column 'prompt': missing column" in capsys.readouterr().err


@pytest.mark.parametrize(
    "name", ["qwen3-4b-sft", "qwen2.5-7b-sft", "qwen3-4b-grpo-tcr", "qwen2.5-7b-grpo-tcr"]
)
def test_the_recipe_header_commands_write_the_files_the_config_reads(name, cache, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    text = (CONFIGS / f"recipe-{name}.yaml").read_text()
    commands = re.findall(r"^#\s+tirl (data prepare .*)$", text, flags=re.M)
    assert commands, "the header says how to prepare the data"
    for command in commands:
        assert main(shlex.split(command)) == 0, command
    cfg = yaml.safe_load(text)
    section = cfg["sft"] if "sft" in name else cfg["rl"]
    wanted = [section["data"], *(section.get("validation", {}).get("data", []))]
    assert all(read_rows(tmp_path / f) for f in wanted)
    if "sft" in name:
        assert re.fullmatch(
            r"Qwen/[\w.-]+", cfg["model"]["path"]
        )  # a Hub id: fetched where the Hub is reachable
