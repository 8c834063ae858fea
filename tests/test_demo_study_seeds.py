"""The GSM8K study's data stage over seeds: its inputs are the split seed's (`task.split_seed`, else `seed`), so a
config that leaves `task.split_seed` at its default fingerprints its data as before the key existed, and a seed
trained on another seed's split (`seed=1 task.split_seed=0`) reuses that seed's data."""

from __future__ import annotations

import json
from pathlib import Path

import tirl.demo.gsm8k_study as study
from tirl.commands.run_config import TirlConfig
from tirl.core.config import load_config
from tirl.demo.command import STUDY_CONFIG
from tirl.demo.stages import config_inputs

# the study config's data-stage inputs at seed 0, as recorded before `task.split_seed` existed
RECORDED = {"config task": "38a9e5144e2daf46", "config seed": "5feceb66ffc86f38"}
SMALL = ["task.num_sft=4", "task.num_rl=3", "task.num_val=2", "task.num_test=3"]


def config(*overrides: str) -> TirlConfig:
    return load_config(TirlConfig, STUDY_CONFIG, list(overrides))


def test_a_default_split_seed_fingerprints_the_data_as_before() -> None:
    cfg = config()
    assert cfg.task.split_seed == -1
    inputs = study.data_inputs(cfg)
    assert {k: inputs[k] for k in RECORDED} == RECORDED
    assert inputs == {**RECORDED, **config_inputs(cfg, ("agent",))}


def test_a_seed_on_seed_0s_split_has_seed_0s_data_inputs() -> None:
    assert study.data_inputs(config("seed=1", "task.split_seed=0")) == study.data_inputs(config())
    assert study.data_inputs(config("seed=0", "task.split_seed=0")) == study.data_inputs(config())
    assert study.data_inputs(config("seed=1"))["config seed"] != RECORDED["config seed"]


def _record(out: Path) -> dict:
    return json.loads((out / "data" / "sft-code.fingerprint.json").read_text(encoding="utf-8"))


def test_the_data_stage_is_reused_for_a_seed_on_the_same_split(tmp_path: Path) -> None:
    out = tmp_path / "out"
    first = study.study_rows(config(*SMALL), out)
    made = _record(out)
    again = study.study_rows(config(*SMALL, "seed=1", "task.split_seed=0"), out)
    assert _record(out) == made and again == first  # reused, not redone
    study.study_rows(config(*SMALL, "seed=1"), out)
    assert _record(out)["made_ns"] != made["made_ns"]  # another split: redone
