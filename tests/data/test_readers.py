"""Schema validation and streaming readers: every bad input names its file, row and column."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tirl.data import RowError, read_dataset, read_rows, write_rows

GOOD = {
    "data_source": "aime24",
    "prompt": [{"role": "user", "content": "What is 1+1?"}],
    "ability": "math",
    "reward_model": {"ground_truth": "2", "style": "rule"},
    "extra_info": {"id": "a"},
}


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_jsonl_and_parquet_round_trip(tmp_path):
    rows = [GOOD, {**GOOD, "extra_info": {"id": "b"}}]
    for name in ("rows.jsonl", "rows.parquet"):
        back = read_rows(write_rows(tmp_path / name, rows))
        assert back == rows


def test_json_string_columns_are_decoded(tmp_path):
    row = {**GOOD, "reward_model": json.dumps(GOOD["reward_model"]), "extra_info": json.dumps({"id": 7})}
    pq.write_table(pa.Table.from_pylist([row]), tmp_path / "lcb.parquet")
    (back,) = read_rows(tmp_path / "lcb.parquet")
    assert back["reward_model"]["ground_truth"] == "2" and back["extra_info"] == {"id": 7}


def test_missing_column_names_file_row_and_column(tmp_path):
    bad = {k: v for k, v in GOOD.items() if k != "reward_model"}
    path = _jsonl(tmp_path / "d.jsonl", [GOOD, bad])
    with pytest.raises(RowError, match=r"d\.jsonl: row 2, column 'reward_model': missing column") as e:
        read_rows(path)
    assert (e.value.row, e.value.column) == (2, "reward_model")


def test_wrong_types_name_the_nested_column(tmp_path):
    path = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist([{**GOOD, "data_source": 5}]), path)
    with pytest.raises(RowError, match=r"d\.parquet: row 1, column 'data_source': expected a non-empty str"):
        read_rows(path)
    bad_msg = {**GOOD, "prompt": [{"role": "user", "content": 3}]}
    with pytest.raises(RowError, match=r"row 1, column 'prompt\[0\]\.content': expected str, got int"):
        read_rows(_jsonl(tmp_path / "m.jsonl", [bad_msg]))
    sft = {"messages": [{"role": "user", "content": "x"}, {"role": "wizard", "content": "y"}]}
    with pytest.raises(RowError, match=r"row 1, column 'messages\[1\]\.role': expected one of system"):
        read_rows(_jsonl(tmp_path / "s.jsonl", [sft]))
    broken_json = {**GOOD, "reward_model": "{not json"}
    with pytest.raises(RowError, match=r"column 'reward_model': expected dict or a JSON string of one"):
        read_rows(_jsonl(tmp_path / "j.jsonl", [broken_json]))


def test_empty_file(tmp_path):
    (tmp_path / "e.jsonl").write_text("\n\n")
    with pytest.raises(ValueError, match=r"e\.jsonl: the file has no rows"):
        read_rows(tmp_path / "e.jsonl")


def test_truncated_parquet(tmp_path):
    path = write_rows(tmp_path / "t.parquet", [GOOD] * 50)
    path.write_bytes(path.read_bytes()[:-200])
    with pytest.raises(ValueError, match=r"t\.parquet: not a readable parquet file"):
        read_rows(path)


def test_non_utf8_jsonl_names_the_row(tmp_path):
    path = tmp_path / "u.jsonl"
    path.write_bytes((json.dumps(GOOD) + "\n").encode() + b'{"data_source": "\xff\xfe"}\n')
    with pytest.raises(RowError, match=r"u\.jsonl: row 2: not valid UTF-8"):
        read_rows(path)


def test_skip_mode_counts_and_reports_every_bad_row(tmp_path):
    path = _jsonl(tmp_path / "mix.jsonl", [GOOD, {"data_source": "x", "prompt": []}, GOOD, [1, 2]])
    with open(path, "a") as f:
        f.write("{oops\n")
    rows, report = read_dataset(path, on_error="skip")
    assert len(rows) == 2 and report.rows == 2 and report.skipped == 3
    assert [e.row for e in report.errors] == [2, 4, 5]
    assert "column 'prompt'" in str(report.errors[0]) and "not valid JSON" in str(report.errors[2])


def test_completion_rows_and_unknown_suffix(tmp_path):
    rows = read_rows(_jsonl(tmp_path / "w.jsonl", [{"prompt": "a", "completion": "b"}]))
    assert rows == [{"prompt": "a", "completion": "b"}]
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(ValueError, match="unsupported data file type '.csv'"):
        read_rows(tmp_path / "x.csv")


def test_sft_parquet_tools_lose_the_nulls_parquet_adds(tmp_path):
    tool_a = {
        "type": "function",
        "function": {"name": "a", "parameters": {"type": "object", "required": ["x"]}},
    }
    tool_b = {"type": "function", "function": {"name": "b", "parameters": {"type": "object"}}}
    row = {
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "a", "arguments": '{"x": 1}'}}]},
            {"role": "tool", "content": "1"},
            {"role": "assistant", "content": "done"},
        ],
        "tools": [tool_a, tool_b],
    }  # fmt: skip
    path = tmp_path / "sft.parquet"
    pq.write_table(pa.Table.from_pylist([row]), path)
    (back,) = read_rows(path)
    assert back["tools"] == [tool_a, tool_b]  # tool_b's missing "required" is not a null
    assert back["messages"][1]["tool_calls"][0]["function"]["arguments"] == {"x": 1}  # JSON string decoded
    assert "tool_calls" not in back["messages"][0]


def test_malformed_tool_calls_name_the_column(tmp_path):
    """tool_calls that are not a list are row errors, not a TypeError."""
    for calls in (5, "print(1)", {"function": {"name": "f", "arguments": {}}}):
        sft = {
            "messages": [
                {"role": "user", "content": "x"},
                {"role": "assistant", "content": "", "tool_calls": calls},
            ]
        }
        with pytest.raises(
            RowError, match=r"row 1, column 'messages\[1\]\.tool_calls': expected a list of tool calls"
        ):
            read_rows(_jsonl(tmp_path / "t.jsonl", [sft]))


def test_read_problems_validates_each_row_once_and_names_a_bad_one(tmp_path, monkeypatch):
    from tirl.data import records, schema
    from tirl.data.records import problem_rows, read_problems

    path = _jsonl(tmp_path / "p.jsonl", [GOOD, {**GOOD, "extra_info": {}}])
    calls = []
    real = schema.validate_rl_row
    monkeypatch.setitem(schema.VALIDATORS, "rl", lambda row: calls.append(1) or real(row))
    monkeypatch.setattr(records, "validate_rl_row", lambda row: calls.append(1) or real(row))
    got = read_problems(path)
    assert len(calls) == 2  # once per row, by the reader
    assert [p.problem_id for p in got] == ["a", "1"]  # extra_info.id, else the row's position in its file
    assert got == problem_rows(read_rows(path)) and problem_rows(got) == got  # records pass through unchecked
    assert len(calls) == 6  # read_rows validates 2, problem_rows validates those 2 again, records 0 times
    with pytest.raises(RowError, match=r"q\.jsonl: row 2, column 'reward_model'"):
        read_problems(
            _jsonl(tmp_path / "q.jsonl", [GOOD, {k: v for k, v in GOOD.items() if k != "reward_model"}])
        )


def test_rows_are_written_only_in_a_format_the_readers_take(tmp_path, capsys):
    from tirl.cli import main

    assert main(["data", "prepare", "gsm8k", "--out", str(tmp_path / "g.csv")]) == 2
    assert "g.csv: cannot write rows as .csv; name it .jsonl or .parquet" in capsys.readouterr().err
    assert not (tmp_path / "g.csv").exists()
    with pytest.raises(ValueError, match="without a suffix"):
        write_rows(tmp_path / "rows", [GOOD])
