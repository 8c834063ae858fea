"""`tirl demo`'s flags choose one packaged recipe (tirl.demo.command.RECIPES); what a recipe does not take is refused
before any run directory exists, naming what it takes."""

from __future__ import annotations

import pytest

from tirl.cli import main
from tirl.commands.run_config import TirlConfig
from tirl.core.config import load_config
from tirl.demo.ablation.presets import objectives, packaged
from tirl.demo.command import RECIPES


def test_every_recipe_is_one_flag_set_with_a_config_that_loads_and_presets_that_exist() -> None:
    assert len({(r.model, r.task, r.study) for r in RECIPES}) == len(RECIPES)
    presets = set(packaged()) | set(objectives())
    for recipe in RECIPES:
        assert load_config(TirlConfig, recipe.config, []).task.name == recipe.task, recipe.flags
        assert recipe.compares() and set(recipe.compares()) <= presets, recipe.flags


@pytest.mark.parametrize(
    "argv, said",
    [
        (
            ["--task", "gsm8k"],
            "no demo runs --model tiny --task gsm8k; the demos: --model tiny --task arith;",
        ),
        (["--study"], "no demo runs --model tiny --task arith --study"),
        (
            ["--model", "smollm2", "--compare", "data"],
            "--model smollm2 --task arith takes --compare lora only",
        ),
        (
            ["--model", "smollm2", "--task", "gsm8k", "--study", "--compare", "lora"],
            "takes --compare data only",
        ),
        (["--compare", "lora"], "--model tiny --task arith takes --compare "),
        (["--model", "smollm2", "--seeds", "2"], "--seeds runs the tiny demo only (without --compare)"),
        (["--compare", "passk", "--seeds", "2"], "--seeds runs the tiny demo only (without --compare)"),
    ],
)
def test_a_flag_set_no_recipe_takes_is_refused_before_any_run(tmp_path, capsys, argv, said) -> None:
    assert main(["demo", *argv, f"out_dir={tmp_path / 'run'}"]) == 2
    assert said in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda r: r.flags)
def test_each_recipe_runs_its_own_runner_on_its_own_config(monkeypatch, tmp_path, recipe) -> None:
    import tirl.demo.command as command

    seen = []
    index = RECIPES.index(recipe)
    chosen = command.Recipe(
        **{**recipe.__dict__, "run": lambda cfg, args: seen.append((cfg.task.name, index))}
    )
    monkeypatch.setattr(command, "RECIPES", (*RECIPES[:index], chosen, *RECIPES[index + 1 :]))
    argv = ["--model", recipe.model, "--task", recipe.task, *(["--study"] if recipe.study else [])]
    assert main(["demo", *argv, f"out_dir={tmp_path / 'run'}"]) == 0
    assert seen == [(recipe.task, index)]
