import pytest

from tirl.eval.evaluate import SampleRecord, summarize_records


def _rec(source, pid, k, correct, pred="1"):
    return SampleRecord(
        "m", pid, source, k, 1.0, 1.0, correct, 1.0 if correct else -1.0, pred, 1, 0, 2, 10, "answer"
    )


def test_sources_with_the_same_ids_are_not_merged():
    records = [_rec("a", "0", k, k == 0) for k in range(4)] + [_rec("b", "0", k, True) for k in range(4)]
    summary = summarize_records(records, ks=[1, 4])
    assert summary["a"]["pass@1"] == pytest.approx(0.25) and summary["b"]["pass@1"] == 1.0
    assert summary["all"]["num_problems"] == 2 and summary["all"]["pass@1"] == pytest.approx(0.625)
    assert summary["all"]["pass@4"] == 1.0
    assert summary["a"]["tool_calls_per_response"] == 1.0


def test_maj_groups_answers_by_the_verifier_not_the_string():
    # three spellings of 1/2 (correct) and "3" twice: by string, "3" (two votes) beats three single votes;
    # by the verifier, 1/2 has three votes and wins
    preds = ["1/2", "3", "0.5", "3", "\\frac{1}{2}"]
    records = [_rec("a", "0", k, p != "3", pred=p) for k, p in enumerate(preds)]
    assert summarize_records(records, ks=[5])["a"]["maj@5"] == 1.0
