"""The curves of an RL run: validation on a fixed slice every N steps (and before the first), its pass@1 in
metrics.jsonl with the steps done, and at the end `curves.json` and `curves.png` (validation pass@1, training reward,
entropy, share of groups with a signal); the signal share and the entropy estimate on hand-made batches."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch

from conftest import make_model
from tirl.cli import main
from tirl.eval.curves import run_curves
from tirl.rollout.types import Trajectory
from tirl.tasks.arith.problems import generate_problems
from tirl.train.rl.batch import global_rollout_metrics


def _traj(group: int, logprobs: list[float], mask: list[int]) -> Trajectory:
    n = len(mask)
    return Trajectory([1], [2] * n, mask, logprobs, ["a"], [], "answer", group=group)


def _metrics(groups: list[int], rewards: list[float], trajs: list[Trajectory] | None = None) -> dict:
    trajs = trajs or [_traj(g, [-1.0], [1]) for g in groups]
    scores = [SimpleNamespace(correct=r > 0) for r in rewards]
    r, g = torch.tensor(rewards), torch.tensor(groups)
    return global_rollout_metrics(trajs, scores, r, g, torch.zeros(len(rewards)))[0]


def test_signal_share_counts_the_groups_whose_rewards_differ():
    # groups 0 and 2 all equal (1, 1 and -1, -1), groups 1 and 3 not: half the groups carry a signal
    m = _metrics([0, 0, 1, 1, 2, 2, 3, 3], [1.0, 1.0, 1.0, -1.0, -1.0, -1.0, 0.0, 1.0])
    assert m["adv/signal_share"] == 0.5 and m["adv/zero_share"] == 0.5
    # three groups of three, one with a single dissenting reward (0.5 vs 0.5000001 differ)
    m = _metrics([0, 0, 0, 1, 1, 1, 2, 2, 2], [0.5, 0.5, 0.5000001, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0])
    assert m["adv/signal_share"] == pytest.approx(1 / 3)
    assert _metrics([0, 0, 1, 1], [1.0, -1.0, -1.0, 1.0])["adv/signal_share"] == 1.0


def test_entropy_is_the_mean_surprisal_of_the_sampled_tokens():
    # tool-output tokens (mask 0, log-prob 0.0) do not count: (1 + 2 + 3 + 1) / 4 sampled tokens
    trajs = [_traj(0, [-1.0, -2.0], [1, 1]), _traj(0, [-3.0, 0.0, -1.0], [1, 0, 1])]
    m = _metrics([0, 0], [1.0, 0.0], trajs)
    assert m["rollout/entropy"] == 1.75


def test_curves_read_every_series_and_place_each_validation_after_its_steps():
    rows = [
        {"step": 0, "val/a/pass@1": 0.1, "val/a/pass@2": 0.2, "val/after_step": 0.0},
        {
            "step": 0,
            "reward/mean": -1.0,
            "reward/accuracy": 0.0,
            "rollout/entropy": 2.0,
            "adv/signal_share": 0.5,
        },
        {
            "step": 1,
            "reward/mean": 0.0,
            "reward/accuracy": 0.5,
            "rollout/entropy": None,
            "adv/signal_share": 1.0,
        },
        {"step": 1, "val/a/pass@1": 0.3, "val/b/pass@1": 0.7, "val/after_step": 2.0},
        {"step": 2, "val/b/pass@1": 0.9},  # an older run's row, without after_step: logged beside step k - 1
    ]
    c = run_curves(rows)
    assert c["train"] == {
        "step": [0, 1],
        "reward/mean": [-1.0, 0.0],
        "reward/accuracy": [0.0, 0.5],
        "rollout/entropy": [2.0, None],
        "adv/signal_share": [0.5, 1.0],
    }
    assert c["validation"] == {
        "after_step": [0, 2, 3],
        "pass@1": {"a": [0.1, 0.3, None], "b": [None, 0.7, 0.9]},
    }


@pytest.fixture()
def model_dir(tokenizer, tmp_path):
    make_model(tokenizer).save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    return tmp_path / "model"


def test_a_three_step_run_validates_on_its_slice_and_draws_its_curves(model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("TIRL_QUIET", "1")
    rows = [p.to_row() for p in generate_problems(7, seed=1)]
    (tmp_path / "rl.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:4]))
    (tmp_path / "val.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[4:]))
    out = tmp_path / "run"
    args = [
        "rl", f"model.path={model_dir}", f"rl.data={tmp_path / 'rl.jsonl'}", f"rl.validation.data=[{tmp_path / 'val.jsonl'}]",
        "rl.validation.every=2", "rl.validation.at_start=true", "eval.max_problems=2", "eval.n=2", "rl.steps=3",
        "rl.prompts_per_step=2", "rl.n=2", "agent.max_response_tokens=16", "agent.max_tokens_per_turn=16",
        "logging.backends=[jsonl]", "--out", str(out),
    ]  # fmt: skip
    assert main(args) == 0
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    val = [m for m in metrics if "val/after_step" in m]
    assert [(m["step"], m["val/after_step"]) for m in val] == [
        (0, 0.0),
        (1, 2.0),
    ]  # before step 1, after step 2
    assert all(0.0 <= m["val/tirl/arith/pass@1"] <= 1.0 for m in val)
    train = [m for m in metrics if "reward/mean" in m]
    assert [m["step"] for m in train] == [0, 1, 2]
    for m in train:
        assert m["adv/signal_share"] == 1.0 - m["adv/zero_share"] and 0 < m["rollout/entropy"] < math.log(512)
    records = (out / "eval" / "step-000002" / "records.jsonl").read_text().splitlines()
    assert len({json.loads(r)["problem_id"] for r in records}) == 2  # the slice: the first eval.max_problems
    curves = json.loads((out / "curves.json").read_text())
    assert curves["validation"]["after_step"] == [0, 2] and curves["train"]["step"] == [0, 1, 2]
    assert curves["validation"]["pass@1"]["tirl/arith"] == [m["val/tirl/arith/pass@1"] for m in val]
    assert curves["train"]["rollout/entropy"] == [m["rollout/entropy"] for m in train]
    assert (out / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
