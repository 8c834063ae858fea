"""The GSM8K study's driver (`tirl.demo.gsm8k_study`) with stand-in stages that record what they were given: the
SFT style is chosen on the validation slice, RL starts from that model on the filtered rows and validates on the
slice, every evaluation the study promises runs, and a training stage a run left midway continues from its
newest checkpoint only when its inputs are the same. The real stages run in the slow smoke run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import tirl.commands.stages as stages
import tirl.demo.gsm8k_study as study
import tirl.demo.smollm2 as smollm2
import tirl.demo.stages as demo_stages
import tirl.eval.report as analyze
from tirl.commands.run_config import TirlConfig
from tirl.core.config import load_config
from tirl.demo.command import STUDY_CONFIG

CURVES = {"validation": {"after_step": [0, 10], "pass@1": {"gsm8k": [0.05, 0.075]}}, "train": {"step": [0]}}


def rows(name: str, n: int) -> list[dict]:
    return [{"name": name, "i": i} for i in range(n)]


@pytest.fixture
def record(monkeypatch, tmp_path) -> dict:
    seen: dict = {"train": [], "eval": []}

    def train(cfg, out_dir, *, model_path, rows, resume=None, restart=False, **_):
        seen["train"].append({"out": Path(out_dir).name, "from": str(model_path), "rows": rows, "cfg": cfg,
                              "resume": resume})  # fmt: skip
        model = Path(out_dir) / "model"
        model.mkdir(parents=True, exist_ok=True)
        (model / "config.json").write_text("{}")
        if Path(out_dir).name == "rl":  # what the RL stage writes last (tirl.eval.curves)
            (Path(out_dir) / "curves.json").write_text(json.dumps(CURVES))
        return model

    def evaluate(cfg, out_dir, *, model_path, label, rows):
        seen["eval"].append({"name": label, "from": str(model_path), "n": cfg.eval.n, "rows": len(rows)})
        score = 0.3 if "sft-text" in str(model_path) else 0.1
        summary = {
            "gsm8k/T=1.0": {
                "pass@1": score,
                "samples_per_problem": 1,
                "tool_calls_per_response": 1.0,
                "no_tool_share": 0.0,
                "tool_error_rate": 0.0,
            }
        }
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        (Path(out_dir) / "summary.json").write_text(json.dumps(summary))
        return summary

    base = tmp_path / "smollm2"
    base.mkdir()
    (base / "config.json").write_text("{}")
    sft = {"code": rows("code", 4), "text": rows("text", 4)}
    fake = study.StudyRows(rows("test", 5), rows("val", 3), rows("rl", 6), sft)
    monkeypatch.setattr(demo_stages, "run_sft", train)
    monkeypatch.setattr(demo_stages, "run_rl", train)
    monkeypatch.setattr(demo_stages, "run_eval", evaluate)
    monkeypatch.setattr(stages, "setup_torch", lambda cfg: None)

    def analyzed(dirs, out, labels):
        seen.setdefault("analyze", []).append(([Path(d).name for d in dirs], Path(out).name, labels))
        return {}

    monkeypatch.setattr(analyze, "run_analyze", analyzed)
    monkeypatch.setattr(analyze, "print_summary", lambda *a, **k: None)
    monkeypatch.setattr(smollm2, "ensure_smollm2", lambda path: base)
    monkeypatch.setattr(study, "study_rows", lambda cfg, out: fake)
    monkeypatch.setattr(study, "filter_rl_rows", lambda run, candidates: candidates[:2])
    monkeypatch.setattr(study, "transfer_rows", lambda: rows("math500", 7))
    return seen


def config(tmp_path: Path) -> TirlConfig:
    return load_config(TirlConfig, STUDY_CONFIG, [f"out_dir={tmp_path / 'out'}"])


def test_rl_starts_from_the_style_better_on_the_validation_slice(record: dict, tmp_path: Path) -> None:
    cfg = config(tmp_path)
    report = study.run_gsm8k_study(cfg)
    trained = {t["out"]: t for t in record["train"]}
    assert list(trained) == ["sft-code", "sft-text", "rl"]
    assert report["sft_choice"]["chosen"] == "text"
    rl = trained["rl"]
    assert rl["from"].endswith("sft-text/model") and rl["rows"] == rows("rl", 2)
    assert rl["cfg"].rl.validation.every == cfg.rl.steps // study.VAL_POINTS
    assert rl["cfg"].rl.validation.data == [str(tmp_path / "out" / "data" / "val-rl.jsonl")]
    assert rl["cfg"].eval.n == study.VAL_N
    evals = {e["name"]: e for e in record["eval"]}
    assert list(evals) == ["val-sft-code", "val-sft-text", "base", "sft", "math500-sft", "rl", "math500-rl"]
    assert evals["val-sft-code"]["rows"] == 3 and evals["val-sft-code"]["n"] == study.VAL_N
    assert evals["sft"]["from"].endswith("sft-text/model") and evals["sft"]["n"] == cfg.eval.n == 16
    assert evals["math500-rl"]["n"] == study.TRANSFER_N and evals["math500-rl"]["rows"] == 7
    saved = json.loads((tmp_path / "out" / "report.json").read_text())
    assert saved["rows"]["rl"] == 2 and set(saved["summary"]) >= {"base", "sft", "rl", "math500-rl"}
    assert {"rl", "rl cpu", "eval_sft", "eval_sft cpu"} <= set(saved["seconds"])
    assert record["analyze"] == [
        (["eval-base", "eval-sft", "eval-rl"], "analysis", ["base", "sft", "rl"]),
        (["eval-sft", "eval-rl"], "analysis-vs-sft", ["sft", "rl"]),
        (["eval-math500-sft", "eval-math500-rl"], "analysis-math500", ["sft", "rl"]),
    ]
    assert saved["analysis_math500"] == "analysis-math500/report.json"
    assert saved["rl_curves"] == CURVES  # the learning curve in the report itself


def test_a_rerun_reuses_every_stage(record: dict, tmp_path: Path) -> None:
    cfg = config(tmp_path)
    study.run_gsm8k_study(cfg)
    done = len(record["train"]), len(record["eval"])
    study.run_gsm8k_study(cfg)
    assert (len(record["train"]), len(record["eval"])) == done


def test_a_stage_left_midway_continues_only_with_the_same_inputs(tmp_path: Path) -> None:
    started = tmp_path / "rl.started.json"
    assert demo_stages.resume_point(started, {"config rl": "a"}) is None  # a first start
    assert demo_stages.resume_point(started, {"config rl": "a"}) == "auto"  # killed, then run again
    assert demo_stages.resume_point(started, {"config rl": "b"}) is None  # other settings: a fresh start
