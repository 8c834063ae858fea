"""`tirl compare`'s parts without training: arms as written on the command line and in YAML, the presets' config
keys, the numbers across seeds and arms on hand-made results (checked by hand), and the loop over seeds and arms
with stand-in stages (who shares which SFT model, a failing arm, a stop request)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

import tirl.demo.ablation.runner as runner
from tirl.cli import main
from tirl.commands.run_config import TirlConfig
from tirl.core.config import ConfigError, load_config, to_dict
from tirl.demo.ablation import starts
from tirl.demo.ablation.arms import Arm, Study, arm_config, parse_arm, read_arms_file, with_overrides
from tirl.demo.ablation.presets import get_preset, preset_names
from tirl.demo.ablation.results import SeedResult, per_problem, summary_metrics
from tirl.demo.ablation.summary import arm_summary, paired, summarize, verdict
from tirl.demo.command import DEMO_CONFIG
from tirl.demo.seeds import lift_interval
from tirl.demo.stages import DemoRows, Model
from tirl.train.signals import StopRequested


def test_an_arm_on_the_command_line_keeps_commas_inside_values():
    arm = parse_arm("hot:eval.temperatures=[0.6,1.0],rl.steps=2, rl.optim.lr=1e-3")
    assert arm == Arm("hot", ("eval.temperatures=[0.6,1.0]", "rl.steps=2", "rl.optim.lr=1e-3"))
    assert parse_arm("plain") == Arm("plain")
    with pytest.raises(ConfigError, match="not key=value"):
        parse_arm("x:rl.steps")
    with pytest.raises(ConfigError, match="arm name"):
        parse_arm("sft:rl.steps=2")  # the shared SFT model's label


def test_arms_file_takes_nested_and_dotted_keys_and_a_baseline(tmp_path):
    f = tmp_path / "arms.yaml"
    f.write_text(
        "baseline: b\narms:\n  a: {rl: {loss: {clip_high: 0.2}}}\n  b: {rl.loss.agg: token-mean, eval.temperatures: [0.6, 1.0]}\n"
    )
    arms, baseline = read_arms_file(f)
    assert baseline == "b"
    assert arms == [
        Arm("a", ("rl.loss.clip_high=0.2",)),
        Arm("b", ("rl.loss.agg=token-mean", "eval.temperatures=[0.6, 1.0]")),
    ]
    cfg = arm_config(TirlConfig(), arms[1])
    assert cfg.rl.loss.agg == "token-mean" and cfg.eval.temperatures == [0.6, 1.0]
    f.write_text("arms: {a: {}}\nseeds: 3\n")
    with pytest.raises(ConfigError, match="unknown keys"):
        read_arms_file(f)


def test_a_study_refuses_duplicate_arms_and_an_unknown_baseline():
    with pytest.raises(ConfigError, match="unique"):
        Study("s", (Arm("a"), Arm("a")))
    with pytest.raises(ConfigError, match="not an arm"):
        Study("s", (Arm("a"), Arm("b")), baseline="c")
    assert Study("s", (Arm("a"), Arm("b"))).baseline_arm == "a"


def test_a_bad_override_fails_its_arm_naming_the_key():
    with pytest.raises(ConfigError, match="arm 'x'.*lr"):
        arm_config(TirlConfig(), Arm("x", ("rl.optim.lr=0",)))
    with pytest.raises(ConfigError, match="arm 'y'.*clip_hihg"):
        arm_config(TirlConfig(), Arm("y", ("rl.clip_hihg=0.3",)))


def _flat(d, prefix=""):
    out = {}
    for k, v in d.items():
        out |= _flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v}
    return out


@pytest.mark.parametrize(
    "name, key, values",
    [
        ("clip-higher", "rl.loss.clip_high", [0.2, 0.28]),
        ("loss-agg", "rl.loss.agg", ["seq-mean-token-mean", "token-mean"]),
        ("tool-reward", "reward.tool_call_bonus", [False, True]),
        ("kl", "rl.kl.coef", [0.001, 0.0]),
        ("entropy-bonus", "rl.entropy_coef", [0.0, 0.001]),
        ("passk", "rl.advantage.name", ["grpo", "passk"]),
        ("pkpo", "rl.advantage.name", ["grpo", "pkpo"]),
    ],
)
def test_each_preset_changes_only_its_key_on_the_demo_config(name, key, values):
    preset = get_preset(name)
    base = with_overrides(load_config(TirlConfig, DEMO_CONFIG), preset.base_overrides)
    arms = [_flat(to_dict(arm_config(base, a))) for a in preset.study.arms]
    assert [a[key] for a in arms] == values
    assert {k for k in arms[0] if arms[0][k] != arms[1][k]} == {key}


def test_the_algorithm_preset_is_the_recipe_against_each_plain_setting_one_key_each():
    preset = get_preset("algorithm")
    base = load_config(TirlConfig, DEMO_CONFIG)
    recipe, *others = [_flat(to_dict(arm_config(base, a))) for a in preset.study.arms]
    assert recipe == _flat(to_dict(base))  # the baseline is the demo's RL as it is, spelled out
    changed = [{k: a[k] for k in a if a[k] != recipe[k]} for a in others]
    assert changed == [
        {"rl.loss.clip_high": 0.2},
        {"rl.loss.agg": "seq-mean-token-mean"},
        {"reward.tool_call_bonus": False},
        {"rl.kl.coef": 0.001},
        {"rl.entropy_coef": 0.001},
    ]
    # the recipe should beat every plain setting the paper has a claim about; the entropy bonus has none
    assert preset.study.expect == {"symmetric": -1, "seq-mean": -1, "no-tool-term": -1, "small-kl": -1}
    assert preset.study.seeds == 5 and preset.study.baseline_arm == "recipe"


def test_the_smollm2_presets_run_its_stages_and_change_lora_or_only_the_sft_rows():
    from tirl.demo.command import CONFIGS

    lora, data = get_preset("lora"), get_preset("data")
    base = load_config(TirlConfig, CONFIGS / lora.config)
    arms = [_flat(to_dict(arm_config(base, a))) for a in lora.study.arms]
    assert {k for k in arms[0] if arms[0][k] != arms[1][k]} == {"model.lora.rank", "rl.optim.lr"}
    assert (arms[0]["model.lora.rank"], arms[1]["model.lora.rank"], arms[1]["rl.optim.lr"]) == (0, 16, 1e-4)
    assert lora.study.stages == data.study.stages == "smollm2" and lora.study.train == "rl"
    base = load_config(TirlConfig, CONFIGS / data.config)
    assert base.task.name == "gsm8k" and data.study.train == "sft"
    stitched, real = data.study.arms
    assert to_dict(arm_config(base, stitched)) == to_dict(arm_config(base, real))  # no config key differs...
    assert (stitched.sft_data, real.sft_data) == ("", "sampled")  # ...the SFT rows do


def test_list_presets_names_every_preset(capsys):
    assert main(["compare", "--list-presets"]) == 0
    said = capsys.readouterr().out
    assert preset_names() == [
        *("algorithm", "clip-higher", "entropy-bonus", "kl", "loss-agg", "tool-reward"),
        *("passk", "pkpo"),
        *("data", "data-rl", "lora"),
    ]  # the packaged files on the tiny stages, the objectives, then the SmolLM2 ones
    assert all(name in said for name in preset_names())
    with pytest.raises(ConfigError, match="valid: algorithm, clip-higher"):
        get_preset("clip-lower")


def test_a_copied_preset_file_runs_as_the_preset_it_copies(tmp_path):
    import argparse
    import shutil

    from tirl.demo.ablation.command import add_compare_arguments, build_study
    from tirl.demo.ablation.presets import PRESETS

    copy = tmp_path / "my-lora.yaml"
    shutil.copy(PRESETS / "lora.yaml", copy)
    parser = argparse.ArgumentParser()
    add_compare_arguments(parser)
    base, study = build_study(parser.parse_args(["--preset", str(copy)]), DEMO_CONFIG)
    packaged_base, packaged = build_study(parser.parse_args(["--preset", "lora"]), DEMO_CONFIG)
    assert study.name == "my-lora" and study == dataclasses.replace(packaged, name="my-lora")
    assert to_dict(base) == to_dict(packaged_base)  # its base config: the file's `config`, demo-smollm2.yaml


def test_a_preset_file_with_an_unknown_key_is_one_line_naming_it(tmp_path):
    bad = tmp_path / "p.yaml"
    bad.write_text("summary: s\narms: {a: {}, b: {rl.steps: 2}}\nbaselin: b\n")
    with pytest.raises(ConfigError, match=r"--preset .*p.yaml: unknown keys \['baselin'\]; valid: arms"):
        get_preset(str(bad))
    bad.write_text("arms: {a: {}}\nnotes: {b: x}\n")
    with pytest.raises(ConfigError, match="notes maps arms of the preset"):
        get_preset(str(bad))


def _result(arm, seed, pass1, training=None):
    """A SeedResult with per-problem pass@1 (and pass@2 = its square root, any second metric will do)."""
    problems = {f"p{i}": v for i, v in enumerate(pass1)}
    per = {"pass@1": problems, "pass@2": {p: v**0.5 for p, v in problems.items()}}
    return SeedResult(arm, seed, {"pass@1": float(np.mean(pass1))}, per, training or {})


def test_arm_summary_spreads_metrics_curves_and_training_bands():
    a = _result("a", 0, [1.0, 0.0], {"rollout/entropy": {0: 1.0, 1: 0.5}})
    b = _result("a", 1, [0.5, 0.5], {"rollout/entropy": {0: 3.0, 1: 1.5, 2: 1.0}})
    s = arm_summary([a, b])
    assert s["seeds"] == [0, 1] and s["metrics"]["pass@1"] == {"mean": 0.5, "min": 0.5, "max": 0.5}
    end = s["metrics"]["rollout/entropy (end)"]  # the mean of each seed's last 5 steps: 0.75 and 5.5 / 3
    assert end == pytest.approx({"mean": (0.75 + 5.5 / 3) / 2, "min": 0.75, "max": 5.5 / 3})
    assert s["pass@k"]["ks"] == [1, 2] and s["pass@k"]["mean"][0] == 0.5
    band = s["training"]["rollout/entropy"]
    assert band == {
        "step": [0, 1, 2],
        "mean": [2.0, 1.0, 1.0],
        "min": [1.0, 0.5, 1.0],
        "max": [3.0, 1.5, 1.0],
        "seeds": [2, 2, 1],
    }


def test_paired_difference_pairs_seeds_and_problems_and_uses_the_seed_bootstrap():
    base = [_result("b", 0, [0.0, 0.5, 1.0]), _result("b", 1, [0.5, 0.5, 0.5])]
    other = [_result("o", 0, [0.5, 0.5, 1.0]), _result("o", 1, [1.0, 0.5, 1.0]), _result("o", 7, [1.0] * 3)]
    d = paired(base, other)
    assert d["seeds"] == [0, 1]  # seed 7 has no baseline to pair with
    got = d["metrics"]["pass@1"]
    expected = lift_interval([np.array([0.5, 0.0, 0.0]), np.array([0.5, 0.0, 0.5])])
    assert (got["mean"], got["lo"], got["hi"]) == expected and got["mean"] == pytest.approx(
        (1 / 6 + 1 / 3) / 2
    )
    assert got["problems"] == [3, 3]
    shifted = paired(
        base,
        [_result("o", s, [v + 0.25 for v in r.per_problem["pass@1"].values()]) for s, r in enumerate(base)],
    )
    assert shifted["metrics"]["pass@1"]["lo"] == pytest.approx(0.25) == shifted["metrics"]["pass@1"]["hi"]


def test_verdict_says_what_holds_and_tests_the_claim():
    diff = {
        "seeds": [0, 1],
        "metrics": {"pass@1": {"mean": 0.05, "lo": 0.01, "hi": 0.09, "problems": [200, 200]}},
    }
    v = verdict("clip-higher", "symmetric", diff, 1)
    assert v["direction"] == 1 and v["claim"] == "holds"
    assert v["line"] == (
        "clip-higher vs symmetric: pass@1 +5.0 points, 95% interval [+1.0, +9.0] (2 seeds x 200 problems, paired): "
        "clip-higher is higher; the claim that clip-higher is higher: holds"
    )
    assert verdict("a", "b", diff, -1)["claim"] == "contradicted"
    diff["metrics"]["pass@1"].update(lo=-0.01)
    v = verdict("a", "b", diff, None)
    assert v["direction"] == 0 and v["claim"] is None and "no difference shown" in v["line"]


def test_summarize_compares_every_finished_arm_with_the_baseline_only():
    results = {"base": [_result("base", 0, [0.0, 0.0])], "up": [_result("up", 0, [1.0, 1.0])], "failed": []}
    s = summarize(results, "base", {"up": 1})
    assert set(s["arms"]) == {"base", "up"}
    (c,) = s["comparisons"]
    assert c["arm"] == "up" and c["metrics"]["pass@1"]["lo"] == 1.0 and c["claim"] == "holds"


def test_records_give_pass_at_k_per_problem_at_the_first_temperature():
    records = [
        {
            "data_source": "s",
            "problem_id": p,
            "temperature": t,
            "correct": c,
            "num_tool_calls": k,
            "response_tokens": 10,
        }
        for t in (0.6, 1.0)
        for p, c, k in (("a", True, 1), ("a", False, 3), ("b", False, 0), ("b", False, 0))
    ]
    per, temperature = per_problem(records)
    assert temperature == 0.6
    assert per["pass@1"] == {"s/a": 0.5, "s/b": 0.0} and per["pass@2"] == {"s/a": 1.0, "s/b": 0.0}
    assert per["tool_calls_per_response"] == {"s/a": 2.0, "s/b": 0.0}
    summary = {"s T=0.6": {"pass@1": 0.25, "maj@1": 0.2, "turns": 2.0}, "s T=1": {"pass@1": 0.5}}
    assert summary_metrics(summary) == {"pass@1 T=0.6": 0.25, "pass@1 T=1": 0.5}


@pytest.fixture
def stages(monkeypatch):
    """Stand-in stages that record (stage, directory) and fail on demand; every other stage of the loop is real."""
    calls: list[tuple[str, str]] = []
    fail: dict[str, BaseException] = {}

    def start(self, cfg, out):
        calls.append(("sft", str(out)))
        return starts.Start(DemoRows([], [], [], []), Model(Path(out) / "sft" / "model", f"sft-{out}"), None)

    def train_rl(cfg, out, start):
        calls.append(("rl", str(out)))
        if out.name in fail:
            raise fail[out.name]
        return Model(out / "model", "rl")

    monkeypatch.setattr(starts.TinyStarts, "start", start)
    monkeypatch.setattr(runner, "train_rl", train_rl)
    monkeypatch.setattr(
        runner, "evaluate", lambda cfg, root, model, label, start: calls.append(("eval", f"eval-{label}"))
    )
    monkeypatch.setattr(runner, "run_analyze", lambda *a, **k: {})
    monkeypatch.setattr(runner, "print_summary", lambda *a: None)
    return calls, fail


def test_arms_share_the_seed_sft_unless_they_change_it_and_a_crash_stops_only_its_arm(stages, tmp_path):
    calls, fail = stages
    fail["rl-boom"] = RuntimeError("out of luck")
    arms = (
        Arm("a"),
        Arm("b", ("rl.loss.clip_high=0.2",)),
        Arm("own", ("sft.epochs=2",)),
        Arm("boom"),
        Arm("bad", ("rl.n=1",)),
    )
    runs = runner.run_arms(TirlConfig(seed=3), Study("s", arms, seeds=2), runner.Layout(tmp_path))
    status = {(r.arm, r.seed): (r.status, r.own_sft) for r in runs}
    assert status[("a", 4)] == ("done", False) and status[("b", 3)] == ("done", False)
    assert status[("own", 3)] == ("done", True)
    assert status[("boom", 3)] == ("failed", False) and status[("bad", 4)] == ("failed", False)
    errors = {r.arm: r.error for r in runs if r.status == "failed"}
    assert errors["boom"] == "RuntimeError: out of luck" and "rl.n=1" in errors["bad"]
    sfts = [d for kind, d in calls if kind == "sft"]
    assert sfts == [
        str(tmp_path / "seed-3"),
        str(tmp_path / "seed-3" / "sft-own"),
        str(tmp_path / "seed-4"),
        str(tmp_path / "seed-4" / "sft-own"),
    ]
    assert ("eval", "eval-boom") not in calls and ("rl", str(tmp_path / "seed-4" / "rl-bad")) not in calls
    assert (tmp_path / "runs.json").is_file()


def test_start_init_gives_every_arm_its_own_sft_and_a_stop_request_ends_the_comparison(stages, tmp_path):
    calls, fail = stages
    runner.run_arms(TirlConfig(), Study("s", (Arm("a"), Arm("b")), start="init"), runner.Layout(tmp_path))
    assert [d for kind, d in calls if kind == "sft"] == [
        str(tmp_path / "seed-0" / f"sft-{a}") for a in ("a", "b")
    ]
    fail["rl-a"] = StopRequested("ckpt", 1)
    with pytest.raises(StopRequested):
        runner.run_arms(TirlConfig(), Study("s", (Arm("a"), Arm("b"))), runner.Layout(tmp_path))


def test_an_arm_on_other_sft_rows_trains_its_own_sft_and_train_sft_compares_the_sft_models(
    stages, tmp_path, monkeypatch
):
    calls, _ = stages
    made = []

    def data_start(self, cfg, out, source, shared):
        made.append((str(out), source, shared.sft.fingerprint))
        return starts.Start(shared.data, Model(Path(out) / "model", f"own-{source}"), shared.run)

    monkeypatch.setattr(starts.TinyStarts, "data_start", data_start)
    arms = (Arm("stitched"), Arm("real", sft_data="sampled"))
    runs = runner.run_arms(TirlConfig(), Study("d", arms, train="sft"), runner.Layout(tmp_path))
    seed = tmp_path / "seed-0"
    assert made == [(str(seed / "sft-real"), "sampled", f"sft-{seed}")]  # from the shared start
    assert [kind for kind, _ in calls] == ["sft", "eval", "eval"]  # no RL
    assert [(r.arm, r.status, r.own_sft, r.rl_dir) for r in runs] == [
        ("stitched", "done", False, ""),
        ("real", "done", True, ""),
    ]


def test_the_tiny_stages_have_no_other_sft_rows(stages, tmp_path):
    runs = runner.run_arms(
        TirlConfig(), Study("d", (Arm("a"), Arm("b", sft_data="sampled"))), runner.Layout(tmp_path)
    )
    assert runs[1].status == "failed" and "SFT data 'sampled'" in runs[1].error


def test_only_picks_arms_of_a_preset_and_stages_runs_them_on_smollm2():
    import argparse

    from tirl.demo.ablation.command import add_compare_arguments, build_study
    from tirl.demo.command import config_of

    parser = argparse.ArgumentParser()
    add_compare_arguments(parser)
    args = parser.parse_args(["--preset", "algorithm", "--only", "recipe,symmetric", "--stages", "smollm2"])
    base, study = build_study(args, DEMO_CONFIG)
    assert [a.name for a in study.arms] == ["recipe", "symmetric"] and study.baseline_arm == "recipe"
    assert study.expect == {"symmetric": -1} and study.stages == "smollm2" and study.seeds == 5
    smollm2 = load_config(TirlConfig, config_of("smollm2"))
    assert to_dict(base) == to_dict(smollm2)  # SmolLM2's own base config under its stages
    _, tiny = build_study(parser.parse_args(["--preset", "algorithm"]), DEMO_CONFIG)
    assert tiny.stages == "tiny" and len(tiny.arms) == 6
    with pytest.raises(ConfigError, match=r"--only 'recipe,nope': no arm \['nope'\]"):
        build_study(parser.parse_args(["--preset", "algorithm", "--only", "recipe,nope"]), DEMO_CONFIG)
