import pytest
import yaml

from tirl.cli import main
from tirl.commands.run_config import TirlConfig
from tirl.core.config import ConfigError, load_config


def test_unknown_key_names_it(capsys):
    assert main(["eval", "rl.lrr=3"]) == 2
    err = capsys.readouterr().err
    assert "rl.lrr" in err and "valid" in err


def test_missing_model_path_is_a_clear_error(capsys, tmp_path):
    assert main(["eval", f"out_dir={tmp_path}"]) == 2
    assert "no model: set model.path" in capsys.readouterr().err


def test_demo_config_loads_and_overrides(tmp_path):
    from tirl.demo.command import DEMO_CONFIG

    cfg = load_config(TirlConfig, DEMO_CONFIG, ["rl.steps=3", "rl.optim.lr=1e-3", "eval.n=4"])
    assert cfg.rl.steps == 3 and cfg.rl.optim.lr == 1e-3 and cfg.eval.n == 4
    assert cfg.demo.tiny.num_layers == 2 and cfg.reward.tool_call_bonus
    with pytest.raises(
        ConfigError, match="rl.advantage.name=ppo2.: unknown advantage estimator .ppo2.; valid"
    ):
        load_config(TirlConfig, DEMO_CONFIG, ["rl.advantage.name=ppo2"])


def test_bad_data_file_is_reported(tmp_path, capsys):
    bad = tmp_path / "rows.jsonl"
    bad.write_text('{"prompt": []}\nnot json\n')
    model_dir = tmp_path / "m"
    model_dir.mkdir()
    assert main(["eval", f"eval.data={bad}", f"model.path={model_dir}", f"out_dir={tmp_path}"]) == 2
    assert "rows.jsonl: row 1, column 'data_source': missing column" in capsys.readouterr().err
    saved = yaml.safe_load((tmp_path / "eval" / "config.yaml").read_text())
    assert saved["eval"]["data"] == str(bad)  # the resolved config is written beside the outputs


def test_a_model_path_without_config_json_is_named(tmp_path, capsys):
    model_dir = tmp_path / "weights-only"
    model_dir.mkdir()
    (model_dir / "model.safetensors").write_bytes(b"")
    assert main(["eval", f"model.path={model_dir}", "--out", str(tmp_path / "eval")]) == 2
    err = capsys.readouterr().err
    assert f"model.path '{model_dir}' has no config.json: not a Hugging Face model directory" in err


def test_eval_warns_when_chat_format_does_not_match_the_models_template(tokenizer, tmp_path, capsys):
    import json

    from conftest import make_model
    from tirl.tasks.arith.problems import generate_problems

    make_model(tokenizer).save_pretrained(tmp_path / "m")
    tokenizer.save_pretrained(tmp_path / "m")  # a plain ChatML template, as SmolLM2's
    rows = tmp_path / "test.jsonl"
    rows.write_text("".join(json.dumps(p.to_row()) + "\n" for p in generate_problems(1, seed=0)))
    args = [f"model.path={tmp_path / 'm'}", f"eval.data={rows}", "eval.n=1", "agent.max_response_tokens=4"]
    assert main(["eval", *args, "chat.format=qwen3", "--out", str(tmp_path / "e1")]) == 0
    assert "chat.format=qwen3 but its chat template is not Qwen's" in capsys.readouterr().out
    assert main(["eval", *args, "chat.format=chatml", "--out", str(tmp_path / "e2")]) == 0
    assert "chat template" not in capsys.readouterr().out


def test_a_model_dir_with_only_config_json_names_the_missing_tokenizer_and_weights(
    tokenizer, tmp_path, capsys
):
    from conftest import make_model

    model_dir = tmp_path / "config-only"
    make_model(tokenizer).config.save_pretrained(model_dir)
    assert [p.name for p in model_dir.iterdir()] == ["config.json"]
    assert main(["eval", f"model.path={model_dir}", "--out", str(tmp_path / "eval")]) == 2
    err = capsys.readouterr().err
    assert f"model.path '{model_dir}' is an incomplete Hugging Face model directory" in err
    assert "no tokenizer files (expected one of tokenizer.json, tokenizer_config.json" in err
    assert "and no weights (expected one of *.safetensors" in err and "sentencepiece" not in err
    tokenizer.save_pretrained(model_dir)  # a tokenizer but still no weights
    assert main(["eval", f"model.path={model_dir}", "--out", str(tmp_path / "eval")]) == 2
    err = capsys.readouterr().err
    assert "it has no weights (expected one of *.safetensors" in err and "tokenizer files" not in err


@pytest.mark.parametrize(
    "argv, said",
    [
        (["--model", "smollm2", "--task", "gsm8k", "task.name=arith"], "--task gsm8k and task.name=arith"),
        (["--task", "arith", "task=gsm8k"], "--task arith and task=gsm8k"),
    ],
)
def test_demo_task_and_a_task_name_that_disagree_are_refused(tmp_path, monkeypatch, capsys, argv, said):
    import tirl.demo.smollm2
    import tirl.demo.tiny

    def ran(*_, **__):
        raise AssertionError("the demo ran one of two tasks")

    monkeypatch.setattr(tirl.demo.smollm2, "run_smollm2_demo", ran)
    monkeypatch.setattr(tirl.demo.tiny, "run_demo", ran)
    assert main(["demo", *argv, f"out_dir={tmp_path / 'run'}"]) == 2
    assert f"{said} name different tasks" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
    seen = []
    monkeypatch.setattr(tirl.demo.tiny, "run_demo", lambda cfg: seen.append(cfg.task.name))
    assert main(["demo", "task=arith", f"out_dir={tmp_path / 'run'}"]) == 0 and seen == ["arith"]  # no --task
