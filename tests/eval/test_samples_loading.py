"""Loading runs: tirl eval directories and verl validation dumps, with errors that name file and line."""

import json

import pytest

from tirl.data.records import ProblemRow
from tirl.eval.evaluate import SampleRecord, write_eval
from tirl.eval.samples import load_run
from tirl.rollout.agent.toolstats import tool_use_stats
from tirl.rollout.types import Outcome, ToolCallRecord, Trajectory


def _traj(pid: str, k: int, correct: bool) -> Trajectory:
    return Trajectory(
        prompt_ids=[1, 2],
        response_ids=[5, 6, 7, 8],
        loss_mask=[1, 0, 0, 1],
        logprobs=[-0.1, 0.0, 0.0, -0.2],
        turn_texts=[
            '<tool_call>{"name": "code_interpreter", "arguments": {"code": "print(6*7)"}}</tool_call>',
            "6 * 7 = 42 so \\boxed{42}",
        ],
        tool_calls=[ToolCallRecord(1, "print(6*7)", "42\n", "ok")],
        stop_reason="answer",
        problem=ProblemRow(
            pid,
            "",
            [{"role": "system", "content": "S"}, {"role": "user", "content": f"What is 6*7? ({pid})"}],
            "42",
        ),
        sample=k,
        outcome=Outcome(correct, 1.0 if correct else -1.0, "42", "correct" if correct else "wrong"),
    )


def write_tirl_run(path, label="m", n=2, problems=("a", "b")):
    recs, trajs = [], []
    for pid in problems:
        for k in range(n):
            ok = k == 0
            recs.append(
                SampleRecord(
                    label,
                    pid,
                    "src",
                    k,
                    1.0,
                    1.0,
                    ok,
                    1.0 if ok else -1.0,
                    "42" if ok else "7",
                    1,
                    0,
                    2,
                    4,
                    "answer",
                )
            )
            trajs.append(_traj(pid, k, ok))
    write_eval(path, recs, trajs, {})
    return path


def test_tirl_run_round_trip(tmp_path) -> None:
    run = load_run(write_tirl_run(tmp_path / "run"), label="renamed")
    assert run.kind == "tirl" and run.label == "renamed" and len(run.samples) == 4
    s = run.samples[0]
    assert s.record.model == "renamed" and s.tool_outputs == ["42\n"] and s.ground_truth == "42"
    assert "6 * 7 = 42" in s.reasoning and "logprobs" not in s.trajectory
    assert s.question == "What is 6*7? (a)"  # the last user message, shown by the viewer


def test_tirl_run_errors_name_the_file_and_line(tmp_path) -> None:
    run_dir = write_tirl_run(tmp_path / "run")
    lines = (run_dir / "records.jsonl").read_text().splitlines()
    bad = json.loads(lines[1])
    del bad["correct"]
    lines[1] = json.dumps(bad)
    (run_dir / "records.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=r"records.jsonl:2: record lacks \['correct'\]"):
        load_run(run_dir)
    with pytest.raises(FileNotFoundError, match="not a tirl eval directory"):
        load_run(tmp_path / "nothing")


def test_verl_dump_import(tmp_path) -> None:
    out = "Let me compute. <tool_call>...</tool_call><tool_response>84\n</tool_response> So \\boxed{84}"
    err = "<tool_call>...</tool_call><tool_response>Traceback (most recent call last):\nNameError: x</tool_response> \\boxed{3}"
    rows = [
        {"input": "Q1", "output": out, "gts": "84", "score": 1.0, "step": 10},
        {"input": "Q1", "output": err, "gts": "84", "score": 0.0, "step": 10},
        {
            "input": "Q2",
            "output": "\\boxed{5}",
            "gts": "5",
            "score": 0.0,
            "acc": True,
            "pred": "5",
            "data_source": "aime",
            "step": 10,
        },
        {
            "input": "Q2",
            "output": "\\boxed{6}",
            "gts": "5",
            "score": 0.0,
            "acc": False,
            "pred": "6",
            "data_source": "aime",
            "step": 10,
        },
    ]
    dump = tmp_path / "val"
    dump.mkdir()
    (dump / "2.jsonl").write_text("{}\n")  # an older step: ignored
    (dump / "10.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = load_run(dump, label="base")
    assert run.kind == "verl" and "10.jsonl" in run.notes[0]
    r = [s.record for s in run.samples]
    assert [x.correct for x in r] == [True, False, True, False]  # score > 0, or acc when present
    assert [x.pred for x in r] == ["84", "3", "5", "6"]
    assert r[0].problem_id == r[1].problem_id != r[2].problem_id and [x.sample_index for x in r] == [
        0,
        1,
        0,
        1,
    ]
    assert [x.data_source for x in r] == ["unknown", "unknown", "aime", "aime"]
    assert [s.question for s in run.samples] == ["Q1", "Q1", "Q2", "Q2"]
    assert (r[0].num_tool_calls, r[0].num_tool_errors, r[1].num_tool_errors) == (1, 0, 1)
    assert run.samples[0].tool_outputs == ["84\n"] and "84\n" not in run.samples[0].reasoning
    (tmp_path / "bad.jsonl").write_text(json.dumps({"input": "Q", "score": 1}) + "\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:1: verl dump line lacks 'output'"):
        load_run(tmp_path / "bad.jsonl")


def test_tool_use_stats_split_by_correctness() -> None:
    stats = tool_use_stats(
        calls=[2, 0, 1, 1], errors=[1, 0, 0, 1], turns=[3, 1, 2, 2], lengths=[100, 20, None, 60],
        stops=["answer", "answer", "budget", "max_turns"], correct=[True, True, False, False],
    )  # fmt: skip
    assert stats["tool_calls_per_response"] == 1.0 and stats["tool_error_rate"] == 0.5
    assert stats["budget_share"] == 0.5 and stats["response_tokens"] == 60.0  # unknown lengths skipped
    assert stats["correct/no_tool_share"] == 0.5 and stats["correct/tool_error_rate"] == 0.5
    assert stats["incorrect/budget_share"] == 1.0 and stats["incorrect/tool_error_rate"] == 0.5
    assert stats["incorrect/response_tokens"] == 60.0
    with pytest.raises(ValueError):
        tool_use_stats([1], [0], [1], [1], ["answer"], [True, False])


def test_budget_share_is_absent_not_zero_when_stop_reasons_are_unknown() -> None:
    # a verl dump has no stop reason: "0% hit a budget" would be a claim the data cannot back
    stats = tool_use_stats([1, 0], [0, 0], [2, 1], [None, None], ["unknown", "unknown"], [True, False])
    assert "budget_share" not in stats and "correct/budget_share" not in stats
    mixed = tool_use_stats([1, 0], [0, 0], [2, 1], [5, 5], ["budget", "unknown"], [True, True])
    assert mixed["budget_share"] == 1.0  # over the responses whose stop reason is known


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("turns", "<img src=x onerror=alert(1)>", r"records.jsonl:2: 'turns' must be an integer"),
        ("sample_index", 1.5, r"records.jsonl:2: 'sample_index' must be an integer"),
        ("temperature", "hot", r"records.jsonl:2: 'temperature' must be a number"),
    ],
)
def test_tirl_record_field_types_are_checked(tmp_path, key, value, message) -> None:
    run_dir = write_tirl_run(tmp_path / "run")
    lines = (run_dir / "records.jsonl").read_text().splitlines()
    bad = json.loads(lines[1])
    bad[key] = value
    lines[1] = json.dumps(bad)
    (run_dir / "records.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=message):
        load_run(run_dir)


def test_tirl_record_numeric_answer_becomes_a_string(tmp_path) -> None:
    run_dir = write_tirl_run(tmp_path / "run")
    lines = (run_dir / "records.jsonl").read_text().splitlines()
    rows = [json.loads(x) for x in lines]
    rows[0]["pred"] = 42  # a hand-written or foreign records file may store the answer as a JSON number
    (run_dir / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert load_run(run_dir).samples[0].record.pred == "42"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"score": None}, r"bad.jsonl:1: 'score' must be a number"),
        ({"score": 1.0, "acc": "yes"}, r"bad.jsonl:1: 'acc' must be a number or true/false"),
        ({"score": 1.0, "temperature": "0.6"}, r"bad.jsonl:1: 'temperature' must be a number"),
    ],
)
def test_verl_dump_value_types_are_checked(tmp_path, extra, message) -> None:
    (tmp_path / "bad.jsonl").write_text(json.dumps({"input": "Q", "output": "\\boxed{1}", **extra}) + "\n")
    with pytest.raises(ValueError, match=message):
        load_run(tmp_path / "bad.jsonl")


def test_a_lone_surrogate_in_model_text_does_not_break_the_report(tmp_path) -> None:
    # valid JSON ("\ud83d" is half an emoji) but not encodable as UTF-8: writing the viewer or report failed
    from tirl.eval.report import run_analyze
    from tirl.eval.tables import AnalysisConfig

    rows = ['{"input": "Q", "output": "half \\ud83d then \\\\boxed{1}", "score": 1.0, "pred": "1\\udc00"}',
            '{"input": "Q", "output": "\\\\boxed{2}", "score": 0.0}']  # fmt: skip
    (tmp_path / "1.jsonl").write_text("\n".join(rows) + "\n")
    run = load_run(tmp_path / "1.jsonl")
    assert "\ufffd" in run.samples[0].raw_output and run.samples[0].record.pred.startswith("1\ufffd")
    run_analyze([tmp_path / "1.jsonl"], tmp_path / "out", config=AnalysisConfig(num_resamples=10))
    assert (tmp_path / "out" / "report.html").is_file()
    assert "\ufffd" in (tmp_path / "out" / "trajectories-data" / "chunk-0000.js").read_text()


@pytest.mark.slow
def test_a_large_run_is_held_compactly(tmp_path) -> None:
    # every trajectory stays in memory for the viewer: as JSON lists, 400 x 2000-token responses (plus prompt ids
    # and log-probs) held ~45 MB; as arrays without the unused fields, ~5 MB
    import random
    import tracemalloc

    rng = random.Random(0)
    with open(tmp_path / "records.jsonl", "w") as fr, open(tmp_path / "trajectories.jsonl", "w") as ft:
        for i in range(400):
            rec = SampleRecord(
                "m", f"p{i // 4}", "s", i % 4, 1.0, 1.0, True, 1.0, "1", 0, 0, 1, 2000, "answer"
            )
            fr.write(json.dumps(rec.__dict__) + "\n")
            ids = [rng.randrange(1000, 150000) for _ in range(2000)]
            traj = {"prompt_ids": ids[:500], "response_ids": ids, "loss_mask": [1] * 2000, "logprobs": [-0.5] * 2000,
                    "turn_texts": ["x"], "tool_calls": [], "stop_reason": "answer", "meta": {"id": f"p{i // 4}"}}  # fmt: skip
            ft.write(json.dumps(traj) + "\n")
    tracemalloc.start()
    try:
        run = load_run(tmp_path)
        held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert held < 12e6 and peak < 20e6, (held, peak)
    t = run.samples[0].trajectory
    assert len(t["response_ids"]) == len(t["loss_mask"]) == 2000 and "prompt_ids" not in t
