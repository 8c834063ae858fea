"""The RL trainer logs the same tool-use numbers as `tirl analyze`, split by correct / incorrect."""

from tirl.rollout.types import ToolCallRecord, Trajectory
from tirl.train.rl.batch import rollout_metrics


def _traj(calls: list[str], stop: str, length: int) -> Trajectory:
    records = [ToolCallRecord(1, "print(1)", "1", s) for s in calls]
    return Trajectory(
        [1], [2] * length, [1] * length, [0.0] * length, ["a"] * (len(calls) + 1), records, stop
    )


def test_rollout_metrics_split_by_correctness() -> None:
    trajs = [
        _traj(["ok"], "answer", 10),
        _traj([], "answer", 4),
        _traj(["runtime_error", "ok"], "budget", 30),
    ]
    m = rollout_metrics(trajs, [1.0, 1.0, -1.0], [True, True, False])
    assert m["rollout/tool_calls_per_response"] == 1.0 and m["rollout/budget_share"] == 1 / 3
    assert m["rollout/correct/tool_calls_per_response"] == 0.5 and m["rollout/correct/no_tool_share"] == 0.5
    assert m["rollout/incorrect/tool_error_rate"] == 0.5 and m["rollout/incorrect/budget_share"] == 1.0
    assert m["rollout/correct/response_tokens"] == 7.0 and m["rollout/incorrect/turns"] == 3.0
    assert "rollout/correct/responses" not in m
