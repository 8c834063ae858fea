import pytest

from tirl.eval.evaluate import SampleRecord, summarize_records


def _rec(source, pid, k, correct):
    return SampleRecord(
        "m", pid, source, k, 1.0, 1.0, correct, 1.0 if correct else -1.0, "1", 1, 0, 2, 10, "answer"
    )


def test_sources_with_the_same_ids_are_not_merged():
    records = [_rec("a", "0", k, k == 0) for k in range(4)] + [_rec("b", "0", k, True) for k in range(4)]
    summary = summarize_records(records, ks=[1, 4])
    assert summary["a"]["pass@1"] == pytest.approx(0.25) and summary["b"]["pass@1"] == 1.0
    assert summary["all"]["num_problems"] == 2 and summary["all"]["pass@1"] == pytest.approx(0.625)
    assert summary["all"]["pass@4"] == 1.0
    assert summary["a"]["tool_calls_per_answer"] == 1.0
