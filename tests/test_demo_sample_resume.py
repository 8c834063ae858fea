"""The data comparison's sampling stage (`tirl.demo.compare_data.sample_real_rows`) with a stand-in sampler that
counts what it is asked: a run stopped after some chunks goes on from the next chunk and ends with the rows an
unbroken run gives; saved progress from other inputs or unreadable is not used; a finished stage is reused."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

import tirl.commands.stages as stages
import tirl.eval.rejection_sampling as sample_mod
from tirl.commands.run_config import TirlConfig
from tirl.demo import compare_data
from tirl.demo.stages import Model, Stages


class Stopped(Exception):
    pass


ANSWER = {"role": "assistant", "content": "\\boxed{0}"}


def problem(i: int) -> dict:
    return {
        "data_source": "gsm8k",
        "prompt": [{"role": "user", "content": f"q{i}"}],
        "reward_model": {"ground_truth": str(i), "style": "rule"},
        "extra_info": {"id": f"p{i}"},
    }


@pytest.fixture
def sampler(monkeypatch) -> dict:
    """Problem i is answered right when i % 3 == 0; `stop_at`: the chunk start that raises (a run stopped)."""
    state: dict = {"starts": [], "stop_at": None}

    class Stats:
        def __init__(self, n: int) -> None:
            self.n = n

        def summary(self) -> dict:
            return {"problems": self.n, "samples": 2 * self.n, "failures": []}

    def sample_rows(agent, rows, cfg, *, params, reward, seed, batch_problems):
        start = int(rows[0]["extra_info"]["id"][1:])
        if state["stop_at"] == start:
            raise Stopped
        state["starts"].append(start)
        assert seed == 0 + start  # each chunk's seed is fixed by where it starts
        kept = [{"problem_id": r["extra_info"]["id"], "messages": r["prompt"] + [ANSWER]} for r in rows
                if int(r["extra_info"]["id"][1:]) % 3 == 0]  # fmt: skip
        return kept, Stats(len(rows))

    monkeypatch.setattr(sample_mod, "sample_rows", sample_rows)
    monkeypatch.setattr(stages, "inference_agent", lambda cfg, model, work: contextlib.nullcontext())
    monkeypatch.setattr(compare_data, "SAMPLE_CHUNK", 4)
    return state


def a_run(tmp_path: Path, name: str = "out") -> Stages:
    cfg = TirlConfig()
    cfg.seed = 0
    model = tmp_path / "sft"
    model.mkdir(exist_ok=True)
    return Stages(cfg, tmp_path / name, models={"sft": Model(model, "sft-print")})


POOL = [problem(i) for i in range(40)]


def test_a_stopped_run_goes_on_from_the_next_chunk(sampler: dict, tmp_path: Path) -> None:
    whole = compare_data.sample_real_rows(a_run(tmp_path, "whole"), POOL, 7, n=2, max_problems=40)
    assert sampler["starts"] == [0, 4, 8, 12, 16]
    assert [r["problem_id"] for r in whole] == [f"p{i}" for i in range(0, 21, 3)]

    sampler["starts"].clear()
    sampler["stop_at"] = 12
    run = a_run(tmp_path)
    with pytest.raises(Stopped):
        compare_data.sample_real_rows(run, POOL, 7, n=2, max_problems=40)
    progress = run.out / "data" / "sft-real.progress.json"
    assert progress.is_file() and not (run.out / "data" / "sft-real.jsonl").exists()

    sampler["starts"].clear()
    sampler["stop_at"] = None
    again = compare_data.sample_real_rows(run, POOL, 7, n=2, max_problems=40)
    assert sampler["starts"] == [12, 16]
    assert again == whole
    summary = (run.out / "data" / "sft-real.jsonl.summary.json").read_text()
    assert '"problems": 20' in summary and '"samples": 40' in summary
    assert not progress.exists()

    sampler["starts"].clear()
    assert compare_data.sample_real_rows(run, POOL, 7, n=2, max_problems=40) == whole
    assert sampler["starts"] == []  # reused


def test_progress_from_other_inputs_or_unreadable_is_not_used(sampler: dict, tmp_path: Path) -> None:
    sampler["stop_at"] = 8
    run = a_run(tmp_path)
    with pytest.raises(Stopped):
        compare_data.sample_real_rows(run, POOL, 7, n=2, max_problems=40)
    sampler["stop_at"] = None
    sampler["starts"].clear()
    compare_data.sample_real_rows(run, POOL, 7, n=3, max_problems=40)  # other samples per problem
    assert sampler["starts"][0] == 0

    progress = run.out / "data" / "sft-real.progress.json"
    progress.write_text("{not json")
    sampler["starts"].clear()
    rows = compare_data.sample_real_rows(run, POOL, 5, n=2, max_problems=40)
    assert sampler["starts"][0] == 0 and len(rows) == 5
