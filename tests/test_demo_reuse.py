"""A demo rerun in the same OUT_DIR reuses a stage's output only when it was made from the same inputs
(`tirl.demo.stages`): other settings or data redo the stages they change and every stage made from them. The
stages are stand-ins that record their calls; the drivers (`run_smollm2_demo`, `run_compare`) are the real ones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import tirl.demo.ablation.report as ablation_report
import tirl.demo.ablation.runner as ablation_runner
import tirl.demo.compare as compare
import tirl.demo.smollm2 as smollm2
import tirl.demo.stages as stages
import tirl.demo.tiny as tiny
from tirl.commands.run_config import TirlConfig
from tirl.core.config import load_config
from tirl.demo.command import DEMO_CONFIG, config_of
from tirl.demo.stages import DemoRows, Model


def fake_rows(cfg: TirlConfig, out: Path) -> DemoRows:
    """SFT and RL rows depend on task.levels, the held-out rows on task.num_test too (as the task's do)."""
    levels = list(cfg.task.levels)
    return DemoRows(
        [{"sft": i, "levels": levels} for i in range(2)],
        [{"rl": i, "levels": levels} for i in range(2)],
        [{"test": i, "levels": levels} for i in range(cfg.task.num_test)],
        [],
    )


def fake_prepare(cfg: TirlConfig, out: Path) -> tuple[DemoRows, Model]:
    return fake_rows(cfg, out), Model(out / "model-init", "init")


@pytest.fixture
def calls(monkeypatch, tmp_path) -> list[str]:
    """The stages that ran, by output directory; every stage a stand-in writing what a real one does."""
    ran: list[str] = []

    def train(cfg, out_dir, *, model_path, rows, restart, **_):
        ran.append(Path(out_dir).name)
        model = Path(out_dir) / "model"
        model.mkdir(parents=True, exist_ok=True)
        (model / "config.json").write_text(json.dumps({"from": str(model_path)}))
        return model

    def evaluate(cfg, out_dir, *, model_path, label, rows):
        ran.append(Path(out_dir).name)
        summary = {"tirl/arith": {"pass@1": 0.5}}
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        (Path(out_dir) / "summary.json").write_text(json.dumps(summary))
        return summary

    base = tmp_path / "smollm2"
    base.mkdir()
    (base / "config.json").write_text("{}")
    monkeypatch.setattr(stages, "run_sft", train)
    monkeypatch.setattr(stages, "run_rl", train)
    monkeypatch.setattr(stages, "run_eval", evaluate)
    for module in (smollm2, ablation_runner):
        monkeypatch.setattr(module, "run_analyze", lambda *a, **k: {})
        monkeypatch.setattr(module, "print_summary", lambda *a: None)
    for module in (smollm2, ablation_report):
        monkeypatch.setattr(module, "setup_torch", lambda cfg: None)
    monkeypatch.setattr(smollm2, "print_table", lambda summary: None)
    monkeypatch.setattr(smollm2, "ensure_smollm2", lambda path: base)
    monkeypatch.setattr(tiny, "demo_rows", fake_rows)
    monkeypatch.setattr(tiny, "prepare", fake_prepare)

    def train_sft(cfg, out, data, init, times):
        return train(cfg, out / "sft", model_path=init.path, rows=data.sft_rows, restart=True)

    monkeypatch.setattr(tiny, "train_sft_model", train_sft)
    return ran


def test_smollm2_demo_redoes_only_the_stages_whose_inputs_changed(calls, tmp_path, capsys):
    def demo(*overrides: str) -> list[str]:
        cfg = load_config(TirlConfig, config_of("smollm2"), [f"out_dir={tmp_path / 'demo'}", *overrides])
        calls.clear()
        smollm2.run_smollm2_demo(cfg)
        return sorted(calls)

    assert demo("task.num_test=3") == ["eval-base", "eval-rl", "eval-sft", "rl", "sft"]
    assert demo("task.num_test=3") == []  # the same inputs: everything reused
    capsys.readouterr()
    assert demo("task.num_test=4") == [
        "eval-base",
        "eval-rl",
        "eval-sft",
    ]  # the held-out set: evaluations only
    said = capsys.readouterr().out
    assert "eval base: redoing it" in said and "changed: data test rows" in said
    assert "sft: reusing" in said
    # SFT's settings: SFT, the RL trained from it and both their evaluations; the base's evaluation stays
    assert demo("task.num_test=4", "sft.epochs=3") == ["eval-rl", "eval-sft", "rl", "sft"]
    assert "changed: config sft" in capsys.readouterr().out
    assert demo("task.num_test=4", "sft.epochs=3", "rl.steps=2") == ["eval-rl", "rl"]
    assert "changed: config rl" in capsys.readouterr().out
    record = json.loads((tmp_path / "demo" / "rl" / "model.fingerprint.json").read_text())
    assert (
        record["inputs"]["model sft"]
        == json.loads((tmp_path / "demo" / "sft" / "model.fingerprint.json").read_text())["fingerprint"]
    )


def test_smollm2_demo_redoes_a_stage_output_without_a_record(calls, tmp_path, capsys):
    cfg = load_config(TirlConfig, config_of("smollm2"), [f"out_dir={tmp_path / 'demo'}", "task.num_test=3"])
    smollm2.run_smollm2_demo(cfg)
    (tmp_path / "demo" / "rl" / "model.fingerprint.json").unlink()  # as a run before records left it
    calls.clear()
    smollm2.run_smollm2_demo(cfg)
    assert sorted(calls) == ["eval-rl", "rl"]
    assert "no record of its inputs" in capsys.readouterr().out


def test_compare_retrains_the_demo_checkpoints_made_from_other_settings(calls, tmp_path, capsys):
    def run(*overrides: str) -> list[str]:
        cfg = load_config(
            TirlConfig, DEMO_CONFIG, [f"out_dir={tmp_path / 'demo'}", "task.num_test=2", *overrides]
        )
        calls.clear()
        compare.run_compare(cfg, "passk")
        return sorted(c for c in calls if not c.startswith("eval-"))  # its evaluations always run

    assert run() == ["rl", "rl-passk", "sft"]
    assert run() == []
    assert run("rl.steps=3") == ["rl", "rl-passk"]
    assert "RL (rl): redoing it" in capsys.readouterr().out
    assert run("rl.steps=3", "task.levels=[1]") == ["rl", "rl-passk", "sft"]  # the data: SFT and all after it


def test_compare_lora_after_the_smollm2_demo_trains_only_the_adapter(calls, tmp_path):
    """`tirl demo --model smollm2 --compare lora`: the preset's stages are the demo's, so its sft/ and rl/ (arm
    `full`) are reused and only rl-lora/ trains; the arms are evaluated into compare-lora/."""
    cfg = load_config(TirlConfig, config_of("smollm2"), [f"out_dir={tmp_path / 'demo'}", "task.num_test=3"])
    smollm2.run_smollm2_demo(cfg)
    calls.clear()
    report = compare.run_compare(cfg, "lora", temperatures=None)
    assert sorted(calls) == ["eval-full", "eval-lora", "rl-lora"]
    assert (tmp_path / "demo" / "compare-lora" / "eval-lora" / "summary.json").is_file()
    assert [r["rl_dir"] for r in report["runs"]] == [str(tmp_path / "demo" / d) for d in ("rl", "rl-lora")]
    record = json.loads((tmp_path / "demo" / "rl-lora" / "model.fingerprint.json").read_text())
    assert (
        record["inputs"]["config model"]
        != json.loads((tmp_path / "demo" / "rl" / "model.fingerprint.json").read_text())["inputs"][
            "config model"
        ]
    )  # the adapter's rank is an input of its RL stage


def test_compare_data_trains_sft_on_the_sampled_rows_and_compares_the_sft_models(
    calls, tmp_path, monkeypatch
):
    import tirl.demo.ablation.starts as starts
    import tirl.tasks.gsm8k as gsm8k

    sampled = []

    def sample(run, pool, want):
        sampled.append((run.models["sft"].path, want))
        return [{"real": i} for i in range(want)]

    monkeypatch.setattr(starts, "sample_real_rows", sample)
    monkeypatch.setattr(gsm8k, "sample_pool", lambda task, seed: [])
    out = tmp_path / "demo"
    cfg = load_config(TirlConfig, config_of("smollm2", "gsm8k"), [f"out_dir={out}", "task.num_test=3"])
    smollm2.run_smollm2_demo(cfg)
    calls.clear()
    report = compare.run_compare(cfg, "data", temperatures=None)
    # the stitched SFT is the demo's (reused); the real arm's SFT trains from the base on the sampled rows; no RL
    assert sorted(calls) == ["eval-real", "eval-stitched", "sft-real"]
    assert sampled == [(out / "sft" / "model", 2)]
    assert {r["arm"]: r["rl_dir"] for r in report["runs"]} == {"stitched": "", "real": ""}
    record = json.loads((out / "sft-real" / "model.fingerprint.json").read_text())
    assert "data sft-real rows" in record["inputs"] and "model base" in record["inputs"]
    assert report["study"]["train"] == "sft" and report["study"]["expect"] == {"real": 1}
    # after RL (`tirl demo --compare data` runs both): the stitched arm's RL is the demo's rl/ (reused), the real
    # arm's RL starts from its SFT model, which is reused; the RL models are compared
    calls.clear()
    after = compare.run_compare(cfg, "data-rl", temperatures=None)
    assert sorted(calls) == ["eval-real", "eval-stitched", "rl-real"]  # no sft-real: its SFT model is reused
    runs = {r["arm"]: r["rl_dir"] for r in after["runs"]}
    assert runs["stitched"] == str(out / "rl") and runs["real"].endswith("rl-real")
    assert after["study"]["train"] == "rl"
