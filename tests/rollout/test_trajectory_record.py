"""The Trajectory record: typed problem/sample fields in memory, the flat `meta` object of trajectories.jsonl on
disk, and files written in that form load back."""

import json

import pytest

from tirl.data.records import ProblemRow
from tirl.rollout.types import Origin, Outcome, ToolCallRecord, Trajectory

PROMPT = [{"role": "user", "content": "What is 6 * 7?"}]


def _eval_traj() -> Trajectory:
    t = Trajectory.start(
        [1, 2], Origin(ProblemRow("p7", "aime24", PROMPT, "42", "math"), sample=3, temperature=0.6)
    )
    t.response_ids, t.loss_mask, t.logprobs = [5, 6], [1, 1], [-0.1, -0.2]
    t.turn_texts, t.stop_reason, t.weight_versions = ["\\boxed{42}"], "answer", [0]
    t.tool_calls = [ToolCallRecord(1, "print(42)", "42\n", "ok")]
    t.outcome = Outcome(True, 1.0, "42", "correct")
    return t


def test_meta_is_the_file_format_key_by_key_in_order():
    d = _eval_traj().to_dict()
    assert list(d) == [
        "prompt_ids", "response_ids", "loss_mask", "logprobs", "turn_texts", "tool_calls", "stop_reason", "meta"
    ]  # fmt: skip
    assert d["meta"] == {
        "id": "p7", "data_source": "aime24", "ability": "math", "ground_truth": "42", "prompt": PROMPT,
        "sample": 3, "temperature": 0.6, "weight_versions": [0],
        "correct": True, "score": 1.0, "pred": "42", "verdict": "correct",
    }  # fmt: skip
    assert list(d["meta"])[5:8] == ["sample", "temperature", "weight_versions"]
    assert d["tool_calls"][0]["code"] == "print(42)"


def test_rl_trajectory_writes_group_before_sample_and_no_outcome():
    t = Trajectory.start([1], Origin(ProblemRow("0", "arith", PROMPT, "42"), sample=1, group=4))
    assert list(t.meta()) == ["id", "data_source", "ability", "ground_truth", "prompt", "group", "sample"]


def test_round_trip_through_the_file_form():
    t = _eval_traj()
    assert Trajectory.from_dict(t.to_dict()) == t
    bare = Trajectory([1], [2], [1], [0.0], ["x"], error="timed out after 1 s", stop_reason="error")
    assert bare.to_dict()["meta"] == {"error": "timed out after 1 s"}
    assert Trajectory.from_dict(bare.to_dict()) == bare


def test_a_hand_written_line_with_a_partial_meta_loads():
    line = {"prompt_ids": [1], "response_ids": [2], "loss_mask": [1], "logprobs": [0.0], "turn_texts": ["x"],
            "tool_calls": [], "stop_reason": "answer", "meta": {"id": 3, "extra": "ignored"}}  # fmt: skip
    t = Trajectory.from_dict(line)
    assert t.problem == ProblemRow("3", "", [], None) and t.sample is None and t.outcome is None
    assert Trajectory.from_dict({**line, "meta": {}}).problem is None


def test_a_meta_dict_in_place_of_the_problem_is_refused():
    with pytest.raises(TypeError, match="must be a ProblemRow or None, got dict"):
        Trajectory([1], [], [], [], [], [], "", {"id": "p"})


def test_a_tool_call_record_without_a_name_loads_as_a_code_interpreter_call_and_writes_back_the_same():
    old = {"turn": 1, "code": "print(42)", "response": "42\n", "status": "ok", "exec_result": None}
    line = {**_eval_traj().to_dict(), "tool_calls": [old]}
    t = Trajectory.from_dict(line)
    assert t.tool_calls[0].name == "code_interpreter" and t.tool_calls[0].arguments is None
    assert json.dumps(t.to_dict()) == json.dumps(
        {**line, "tool_calls": [{**old, "name": "code_interpreter", "arguments": None, "result_seen": True}]}
    )
    assert json.dumps(Trajectory.from_dict(t.to_dict()).to_dict()) == json.dumps(t.to_dict())
