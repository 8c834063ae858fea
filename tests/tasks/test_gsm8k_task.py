"""The `gsm8k` task: disjoint SFT / RL / sample-pool / test splits fixed by seed, the step-count knob, stitched SFT."""

from __future__ import annotations

import pytest

from tirl.commands.run_config import TirlConfig
from tirl.tasks import load_task
from tirl.tasks.gsm8k import (
    GSM8KOptions,
    calculator_steps,
    gsm8k_records,
    gsm8k_rows,
    gsm8k_training_data,
    sample_pool,
)


def _cfg(seed: int = 0, **task) -> tuple[GSM8KOptions, int]:
    """(the task's options, the seed): what a task is built from."""
    base = {"name": "gsm8k", "num_sft": 40, "num_rl": 30, "num_test": 25, "levels": [1, 2, 3]}
    return GSM8KOptions(**{**base, **task}), seed


def _ids(rows) -> set[str]:
    return {r["extra_info"]["id"] for r in rows}


def test_splits_are_disjoint_fixed_by_seed_and_follow_the_step_knob():
    cfg = _cfg()
    rl, test, pool = gsm8k_rows("train", *cfg), gsm8k_rows("test", *cfg), sample_pool(*cfg)
    assert (len(rl), len(test)) == (30, 25)
    assert not _ids(rl) & _ids(pool)
    assert all(i.startswith("gsm8k-train-") for i in _ids(rl) | _ids(pool))
    assert all(i.startswith("gsm8k-") and "train" not in i for i in _ids(test))
    assert {r["extra_info"]["steps"] for r in rl + test + pool} <= {1, 2, 3}
    assert gsm8k_rows("test", *cfg) == test  # the same seed, the same held-out set
    assert _ids(gsm8k_rows("test", *_cfg(seed=1))) != _ids(test)
    two = _cfg(levels=[2])
    assert {r["extra_info"]["steps"] for r in gsm8k_rows("train", *two) + gsm8k_rows("test", *two)} == {2}
    every = _cfg(levels=[])
    assert len(sample_pool(*every)) + 30 == len(gsm8k_records("train"))


def test_steps_are_the_solutions_calculator_annotations():
    rec = {"answer": "48/2 = <<48/2=24>>24 and 48+24 = <<48+24=72>>72\n#### 72"}
    assert calculator_steps(rec) == 2


def test_too_many_problems_for_the_knob_name_the_keys():
    with pytest.raises(ValueError, match=r"task.num_sft \+ num_rl \+ num_val = 9000 .*\(task.levels\)"):
        gsm8k_rows("train", *_cfg(num_sft=5000, num_rl=4000))
    with pytest.raises(ValueError, match="task.num_test = 5000"):
        gsm8k_rows("test", *_cfg(num_test=5000))


def test_demo_data_is_stitched_sft_on_the_pools_front(sandbox):
    cfg = _cfg(num_sft=12)
    demo = gsm8k_training_data(*cfg, sandbox, TirlConfig().agent.max_tool_response_chars)
    assert len(demo.sft_rows) == 12 and demo.rl_rows == gsm8k_rows("train", *cfg)
    sft_ids = [r["problem_id"] for r in demo.sft_rows]
    pool_ids = [r["extra_info"]["id"] for r in sample_pool(*cfg)]
    assert set(sft_ids) <= set(pool_ids[:20])  # the front, in order, skipping the few that do not stitch
    assert sft_ids == [i for i in pool_ids if i in set(sft_ids)]
    assert all(
        r["messages"][1]["tool_calls"] and "\\boxed{" in r["messages"][-1]["content"] for r in demo.sft_rows
    )
    assert load_task("gsm8k").rows is gsm8k_rows
