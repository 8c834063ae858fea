"""`fidelity: recipe` resolves every row of the fidelity table to the recipe's behaviour; tirl's defaults stay."""

from pathlib import Path

import pytest

from tirl.commands.run_config import TirlConfig
from tirl.core.config import ConfigError, load_config, save_config
from tirl.core.fidelity import ROWS, departures, get_value

CONFIGS = Path(__file__).parents[1] / "src" / "tirl" / "configs"
RECIPES = sorted(CONFIGS.glob("recipe-*.yaml"))
DOC = Path(__file__).parents[1] / "docs" / "fidelity.md"

RECIPE = {  # each row's recipe value, written out by hand from the recipe's code (docs/open-agentrl.md §10)
    "reward.grading": "math_dapo",
    "rl.prompt_rewrite": "verl",
    "sandbox.timeout_s": 30.0,
    "sandbox.memory_mb": 2048,
    "reward.code_timeout_s": 30.0,
    "rl.correction.mode": "none",
    "rollout.dtype": "bfloat16",
    "rl.loss.token_mean": "micro",
    "sft.loss_mean": "micro",
    "agent.token_stream": "verl",
    "agent.malformed_calls": "drop",
    "rl.validation.at_start": True,
    "eval.log_generations": 20,
}


def test_the_table_has_every_row_once():
    assert [r.key for r in ROWS] == list(RECIPE)
    assert {r.key: r.recipe for r in ROWS} == RECIPE


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_recipe_configs_resolve_every_row_to_the_recipe(path):
    cfg = load_config(TirlConfig, path)
    assert cfg.fidelity == "recipe"
    assert {key: get_value(cfg, key) for key in RECIPE} == RECIPE
    assert departures(cfg) == []


def test_default_is_tirl_everywhere():
    cfg = TirlConfig()
    assert cfg.fidelity == "tirl"
    assert {r.key: get_value(cfg, r.key) for r in ROWS} == {r.key: r.tirl for r in ROWS}
    demo = load_config(TirlConfig, CONFIGS / "demo.yaml")
    assert [r.key for r in departures(demo)] == list(RECIPE)


def test_one_switch_on_any_config_and_a_third_value_is_kept():
    cfg = load_config(TirlConfig, CONFIGS / "demo.yaml", ["fidelity=recipe", "sandbox.timeout_s=60"])
    assert cfg.sandbox.timeout_s == 60.0  # neither tirl's nor the recipe's: the user's
    assert [r.key for r in departures(cfg)] == ["sandbox.timeout_s"]


def test_resolved_config_round_trips(tmp_path):
    cfg = load_config(TirlConfig, RECIPES[0])
    save_config(cfg, tmp_path / "config.yaml")
    assert load_config(TirlConfig, tmp_path / "config.yaml") == cfg


def test_bad_values_name_the_key():
    with pytest.raises(ConfigError, match="fidelity"):
        load_config(TirlConfig, None, ["fidelity=verl"])
    with pytest.raises(ConfigError, match="reward.grading"):
        load_config(TirlConfig, None, ["reward.grading=strict"])
    with pytest.raises(ConfigError, match="rollout.dtype"):
        load_config(TirlConfig, None, ["rollout.dtype=bf16"])


def test_rollout_correction_off_under_recipe_with_a_server_engine():
    from tirl.rollout.factory import capabilities_for

    vllm = capabilities_for("vllm")
    tirl, recipe = TirlConfig(), load_config(TirlConfig, None, ["fidelity=recipe"])
    assert vllm.rollout_correction(tirl.rl.correction.mode) == "token_tis"
    assert vllm.rollout_correction(recipe.rl.correction.mode) == "none"


def test_vllm_engine_gets_rollout_dtype(monkeypatch, tokenizer, model, tmp_path):
    import tirl.rollout.engines.vllm.engine as ve
    import tirl.rollout.engines.vllm.weights as vw
    from tirl.rollout.factory import EngineInputs, build_engine

    seen = {}

    class Fake:
        capabilities = ve.VLLMEngine.capabilities

        def __init__(self, config):
            seen["dtype"] = config.dtype

        def check(self, tokenizer):
            pass

    monkeypatch.setattr(ve, "VLLMEngine", Fake)
    monkeypatch.setattr(vw, "servable_dir", lambda *a, **k: tmp_path)
    for overrides, want in (([], "float32"), (["fidelity=recipe"], "bfloat16")):
        cfg = load_config(TirlConfig, None, ["rollout.engine=vllm", *overrides])
        build_engine(cfg.rollout, EngineInputs(model, tokenizer, 0, 0, dtype=cfg.model.dtype))
        assert seen["dtype"] == want


def test_docs_table_lists_every_key():
    text = DOC.read_text(encoding="utf-8")
    for row in ROWS:
        assert f"`{row.key}`" in text, row.key


def test_recipe_changes_only_what_the_user_did_not_set(tmp_path):
    """A key set to tirl's default on purpose (file or override) keeps it; keys left out take the recipe's."""
    path = tmp_path / "run.yaml"
    path.write_text("fidelity: recipe\nsandbox:\n  timeout_s: 5.0\n")
    cfg = load_config(TirlConfig, path, ["reward.grading=verify"])
    assert (cfg.sandbox.timeout_s, cfg.reward.grading) == (5.0, "verify")  # tirl's defaults, chosen
    assert (cfg.sandbox.memory_mb, cfg.rl.prompt_rewrite) == (2048, "verl")  # left out: the recipe's
    again = load_config(TirlConfig, save_config(cfg, tmp_path / "saved.yaml"))
    assert again == cfg  # the saved config reloads to the same run
