"""The GSM8K study's data comparison (`tirl.demo.gsm8k_data_study`) with stand-in training, evaluation and
sampling that record what they were given: it refuses a study that has not chosen its SFT model, both arms train
on the same problems (stitched rows matched to the sampled ones), each arm's RL starts from its own SFT on the
study's RL rows, and a rerun reuses every stage. The real stages are the study's (test_demo_study.py) and the
sampler's (`tirl data sample`, the slow GSM8K smoke test)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import tirl.commands.stages as stages
import tirl.demo.gsm8k_data_study as data_study
import tirl.demo.smollm2 as smollm2
import tirl.demo.stages as demo_stages
import tirl.eval.report as analyze
import tirl.tasks.gsm8k as gsm8k
from tirl.cli import main
from tirl.commands.run_config import TirlConfig
from tirl.core.config import load_config
from tirl.data import read_rows, write_rows
from tirl.demo.command import STUDY_CONFIG


def problem(i: int) -> dict:
    return {
        "data_source": "gsm8k",
        "prompt": [{"role": "user", "content": f"q{i}"}],
        "reward_model": {"ground_truth": str(i), "style": "rule"},
        "extra_info": {"id": f"gsm8k-train-{i}"},
    }


def stitched(i: int) -> dict:
    return {
        "messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": "\\boxed{1}"}],
        "problem_id": f"gsm8k-train-{i}",
        "style": "x",
    }


@pytest.fixture
def seen(monkeypatch, tmp_path) -> dict:
    seen: dict = {"train": [], "eval": [], "sample": [], "analyze": []}

    def train(cfg, out_dir, *, model_path, rows, resume=None, restart=False, **_):
        seen["train"].append({"out": Path(out_dir).name, "from": str(model_path), "rows": rows,
                              "engine": cfg.rollout.engine, "validate": cfg.rl.validation.every})  # fmt: skip
        model = Path(out_dir) / "model"
        model.mkdir(parents=True, exist_ok=True)
        (model / "config.json").write_text("{}")
        return model

    def evaluate(cfg, out_dir, *, model_path, label, rows):
        seen["eval"].append({"name": label, "from": str(model_path), "temps": cfg.eval.all_temperatures})
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        summary = {"gsm8k/T=1.0": {"pass@1": 0.1, "pass@16": 0.2, "samples_per_problem": 16,
                                   "tool_calls_per_response": 1.0, "no_tool_share": 0.0,
                                   "tool_error_rate": 0.0}}  # fmt: skip
        (Path(out_dir) / "summary.json").write_text(json.dumps(summary))
        return summary

    def sample(run, pool, want, n, max_problems, keep_retokenized):
        seen["sample"].append({"pool": [p["extra_info"]["id"] for p in pool], "want": want, "n": n,
                               "sampler": str(run.models["sft"].path), "retok": keep_retokenized})  # fmt: skip
        # the problems 7 and 2 answered correctly, in pool order
        return [
            {**stitched(int(p["extra_info"]["id"][-1])), "style": "sampled"}
            for p in pool
            if p["extra_info"]["id"][-1] in "72"
        ]

    def analyzed(dirs, out, labels):
        seen["analyze"].append({"dirs": [Path(d).name for d in dirs], "labels": labels})
        return {}

    base = tmp_path / "smollm2"
    base.mkdir()
    (base / "config.json").write_text("{}")
    monkeypatch.setattr(demo_stages, "run_sft", train)
    monkeypatch.setattr(demo_stages, "run_rl", train)
    monkeypatch.setattr(demo_stages, "run_eval", evaluate)
    monkeypatch.setattr(stages, "setup_torch", lambda cfg: None)
    monkeypatch.setattr(analyze, "run_analyze", analyzed)
    monkeypatch.setattr(analyze, "print_summary", lambda *a, **k: None)
    monkeypatch.setattr(smollm2, "ensure_smollm2", lambda path: base)
    monkeypatch.setattr(data_study, "sample_real_rows", sample)
    # the task's sample pool: problems 0-9, of which the study stitched 7, 2, 5 (in that order)
    monkeypatch.setattr(gsm8k, "sample_pool", lambda task, seed: [problem(i) for i in range(10)])
    return seen


def config(tmp_path: Path) -> TirlConfig:
    return load_config(TirlConfig, STUDY_CONFIG, [f"out_dir={tmp_path / 'study'}"])


def finished_study(tmp_path: Path) -> Path:
    """A study directory past its SFT choice (text) and its filter."""
    out = tmp_path / "study"
    (out / "sft-text" / "model").mkdir(parents=True)
    (out / "sft-text" / "model" / "config.json").write_text("{}")
    write_rows(out / "data" / "sft-text.jsonl", [stitched(i) for i in (7, 2, 5)])
    write_rows(out / "data" / "test.jsonl", [problem(100 + i) for i in range(4)])
    write_rows(out / "data" / "rl.jsonl", [problem(200 + i) for i in range(3)])
    (out / "report.json").write_text(json.dumps({"sft_choice": {"chosen": "text"}}))
    return out


def test_it_needs_a_study_that_chose_its_sft(seen: dict, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="run `tirl demo --model smollm2 --task gsm8k --study` first"):
        data_study.run_study_data_comparison(config(tmp_path))
    assert not seen["train"] and not seen["sample"]


def test_both_arms_train_on_the_same_problems_then_rl_from_each(seen: dict, tmp_path: Path) -> None:
    study = finished_study(tmp_path)
    report = data_study.run_study_data_comparison(config(tmp_path))
    (sample,) = seen["sample"]
    # the study's SFT problems only, in the task's pool order
    assert sample["pool"] == ["gsm8k-train-2", "gsm8k-train-5", "gsm8k-train-7"]
    assert sample["want"] == data_study.ROWS and sample["n"] == data_study.SAMPLE_N and sample["retok"]
    assert sample["sampler"] == str(study / "sft-text" / "model")
    trained = {t["out"]: t for t in seen["train"]}
    assert list(trained) == ["sft-stitched", "sft-real", "rl-stitched", "rl-real"]
    assert [r["problem_id"] for r in trained["sft-stitched"]["rows"]] == ["gsm8k-train-2", "gsm8k-train-7"]
    assert trained["sft-stitched"]["rows"][0]["style"] == "x"  # the study's own stitched rows
    assert trained["sft-real"]["rows"][0]["style"] == "sampled"
    assert [r["problem_id"] for r in trained["sft-real"]["rows"]] == ["gsm8k-train-2", "gsm8k-train-7"]
    for arm in ("stitched", "real"):
        assert trained[f"sft-{arm}"]["from"] == str(tmp_path / "smollm2")
        assert trained[f"rl-{arm}"]["from"] == str(study / "compare-data" / f"sft-{arm}" / "model")
        assert len(trained[f"rl-{arm}"]["rows"]) == 3
        assert trained[f"rl-{arm}"]["engine"] == "torch" and trained[f"rl-{arm}"]["validate"] == 0
    assert [e["name"] for e in seen["eval"]] == ["sft-stitched", "sft-real", "rl-stitched", "rl-real"]
    assert all(e["temps"] == [1.0] for e in seen["eval"])
    assert seen["analyze"] == [
        {"dirs": ["eval-sft-stitched", "eval-sft-real"], "labels": ["stitched", "real"]},
        {"dirs": ["eval-rl-stitched", "eval-rl-real"], "labels": ["stitched", "real"]},
    ]
    assert report["rows"] == {"sft": 2, "rl": 3, "pool": 3, "sampler": "text"}
    assert (
        read_rows(study / "compare-data" / "data" / "sft-stitched.jsonl") == trained["sft-stitched"]["rows"]
    )
    saved = json.loads((study / "compare-data" / "report.json").read_text())
    assert set(saved["summary"]) == {"sft-stitched", "sft-real", "rl-stitched", "rl-real"}
    assert not (study / "compare-data" / "report.json").samefile(study / "report.json")


def test_a_rerun_reuses_every_stage(seen: dict, tmp_path: Path) -> None:
    finished_study(tmp_path)
    data_study.run_study_data_comparison(config(tmp_path))
    done = len(seen["train"]), len(seen["eval"])
    data_study.run_study_data_comparison(config(tmp_path))
    assert (len(seen["train"]), len(seen["eval"])) == done


def test_the_cli_takes_only_the_data_comparison_with_the_study(capsys) -> None:
    assert main(["demo", "--model", "smollm2", "--task", "gsm8k", "--study", "--compare", "lora"]) == 2
    assert "takes --compare data only" in capsys.readouterr().err


def test_matched_rows_refuses_a_problem_without_a_stitched_row() -> None:
    with pytest.raises(ValueError, match="gsm8k-train-9"):
        data_study.matched_rows([stitched(1)], [stitched(9)])


def test_only_settings_the_demo_does_not_use_enter_the_sampled_rows_fingerprint() -> None:
    from tirl.demo import compare_data

    # the demo's own call: its earlier sampled rows are still reused
    assert compare_data._settings_inputs(compare_data.SAMPLE_N, None, False) == {}
    changed = compare_data._settings_inputs(8, 1000, True)
    assert set(changed) == {"samples per problem", "problems tried", "keep retokenized"}
