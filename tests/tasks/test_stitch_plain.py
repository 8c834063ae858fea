"""The plain style of stitched GSM8K rows, the no-tool arm's SFT data: the human solution's sentences with every
calculator annotation removed and its result kept as written, the tool styles' answer line, no tool anywhere; the
same problems as the text style."""

from tirl.cli import main
from tirl.data import read_rows
from tirl.data.schema import validate_sft_row
from tirl.tasks.gsm8k import gsm8k_records
from tirl.tasks.gsm8k.stitch import StitchConfig, stitch_rows

# GSM8K train rows 0, 1, 4 and 2040 (the packaged split), and their plain assistant turns, written out by hand
RECORDS = [gsm8k_records("train")[i] for i in (0, 1, 4, 2040)]
EXPECTED = [
    "Natalia sold 48/2 = 24 clips in May.\nNatalia sold 48+24 = 72 clips altogether in April and May.\n"
    "The answer is \\boxed{72}.",
    "Weng earns 12/60 = $0.2 per minute.\nWorking 50 minutes, she earned 0.2 x 50 = $10.\n"
    "The answer is \\boxed{10}.",
    "He writes each friend 3*2=6 pages a week\nSo he writes 6*2=12 pages every week\n"
    "That means he writes 12*52=624 pages a year\nThe answer is \\boxed{624}.",
    "There are 22 pieces of pizza because 14 plus 8 equals 22.\nThey have eaten 18 pieces of pizza because 9 "
    "plus 9 equals 18.\nThere are 4 pieces of pizza left because 22 minus 18 equals 4.\nThere are 2 pieces per "
    "person because 4 divided by 2 equals 2.\nThe answer is \\boxed{2}.",
]


def _stitched(sandbox, records, style="plain"):
    ids = [f"t-{i}" for i in range(len(records))]
    return stitch_rows(records, ids, sandbox, StitchConfig(style=style, wording="plain"))


def test_the_answer_is_the_solution_with_its_annotations_resolved(sandbox):
    rows, report = _stitched(sandbox, RECORDS)
    assert report.kept == 4
    assert [[m["role"] for m in r["messages"]] for r in rows] == [["user", "assistant"]] * 4
    assert [r["messages"][1]["content"] for r in rows] == EXPECTED
    assert [r["steps"] for r in rows] == [2, 2, 3, 4]
    assert {r["style"] for r in rows} == {"stitched-plain"}


def test_no_row_of_the_train_split_holds_a_tool_call(sandbox, renderer):
    records = gsm8k_records("train")[:40]
    rows, _ = _stitched(sandbox, records)
    assert len(rows) >= 36  # about 94% of solutions stitch
    for row in rows:
        validate_sft_row(row)  # a valid SFT row
        assert row["tools"] == []
        assert all(m["role"] in ("user", "assistant") and "tool_calls" not in m for m in row["messages"])
        text = renderer.text(row["messages"])
        assert "<<" not in text and "<tool_call>" not in text and "code_interpreter" not in text
        assert row["messages"][-1]["content"].endswith("}.") and "\\boxed{" in row["messages"][-1]["content"]


def test_plain_keeps_the_problems_the_text_style_keeps(sandbox):
    records = gsm8k_records("train")[:40]
    plain, plain_report = _stitched(sandbox, records)
    text, text_report = _stitched(sandbox, records, style="text")
    assert [r["problem_id"] for r in plain] == [r["problem_id"] for r in text]
    assert plain_report.dropped == text_report.dropped


def test_cli_style_plain(tmp_path, capsys):
    out = tmp_path / "plain.jsonl"
    assert main(["data", "stitch", "gsm8k", "--out", str(out), "--limit", "2", "--style", "plain"]) == 0
    rows = read_rows(out)
    assert "gsm8k train: 2 of 2 solutions kept" in capsys.readouterr().out
    assert [r["messages"][1]["content"] for r in rows] == EXPECTED[:2]
    assert [r["problem_id"] for r in rows] == ["gsm8k-train-0", "gsm8k-train-1"]
