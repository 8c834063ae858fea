"""`rl.loss.*` and `rl.advantage.*`: each loss and estimator carries its own settings, the old flat keys are refused
naming the new ones, and `tirl config migrate` rewrites an older config.yaml so that it loads and runs as before."""

from dataclasses import dataclass

import pytest
import torch
import yaml

from conftest import make_model
from tirl.algorithms import POLICY_LOSSES, LossOptions, aggregate, register_policy_loss
from tirl.cli import main
from tirl.commands.config import migrate_file
from tirl.commands.run_config import TirlConfig
from tirl.core.config import ConfigError, load_config, to_dict
from tirl.train.batch import collate
from tirl.train.rl.config import MOVED_TO_SECTIONS, MOVED_TO_VARIANTS
from tirl.train.rl.update import LossSpec, accumulate_gradients


def _spec(*overrides: str) -> LossSpec:
    rl = load_config(TirlConfig, None, ["rl.micro_batch_tokens=0", *overrides]).rl
    return LossSpec.for_rl(rl, POLICY_LOSSES[rl.loss.name], norm_len=8, temperature=1.0, autocast=None)


def test_gspo_gets_the_gspo_clip_range_unless_set():
    spec = _spec("rl.loss.name=gspo")
    assert spec.hyper == {"clip_low": 3e-4, "clip_high": 4e-4}  # the paper's, not PPO's 0.2 / 0.28
    assert spec.agg == "seq-mean-token-mean"
    assert _spec("rl.loss.clip_low=0.1", "rl.loss.name=gspo").hyper == {"clip_low": 0.1, "clip_high": 4e-4}


def test_an_arm_that_switches_the_loss_gets_the_new_losss_defaults():
    """`tirl compare` arms apply overrides to a whole saved config (every ppo key written out, clip_c too): naming
    another loss starts its section afresh, and the arm's own options for it hold in either order."""
    from tirl.demo.ablation.arms import Arm, arm_config

    base = load_config(TirlConfig, None, ["rl.loss.clip_high=0.3"])
    assert arm_config(base, Arm("g", ("rl.loss.name=gspo",))).rl.loss.clip_high == 4e-4
    for order in (
        ("rl.loss.name=gspo", "rl.loss.clip_low=0.001"),
        ("rl.loss.clip_low=0.001", "rl.loss.name=gspo"),
    ):
        loss = arm_config(base, Arm("g", order)).rl.loss
        assert (loss.name, loss.clip_low, loss.clip_high) == ("gspo", 0.001, 4e-4), order
    assert arm_config(base, Arm("p", ("rl.loss.name=ppo",))).rl.loss.clip_high == 0.3  # the same loss: kept


def test_the_default_loss_keeps_grpo_tcrs_settings():
    spec = _spec()
    assert spec.hyper == {"clip_low": 0.2, "clip_high": 0.28, "clip_c": 10.0}
    assert (spec.agg, spec.token_mean, spec.norm_len) == ("token-mean", "exact", 8)


def test_a_key_the_chosen_loss_lacks_is_refused_with_its_keys():
    with pytest.raises(ConfigError, match=r"'rl.loss.clip_c'.*valid keys at 'rl.loss' \(GSPOOptions\): name"):
        load_config(TirlConfig, None, ["rl.loss.name=gspo", "rl.loss.clip_c=3"])
    with pytest.raises(ConfigError, match=r"'rl.advantage.k'.*valid keys at 'rl.advantage'"):
        load_config(TirlConfig, None, ["rl.advantage.k=2"])  # grpo takes no k
    assert load_config(TirlConfig, None, ["rl.advantage.k=2", "rl.advantage.name=pkpo"]).rl.advantage.k == 2


@pytest.mark.parametrize("old, new", sorted({**MOVED_TO_VARIANTS, **MOVED_TO_SECTIONS}.items()))
def test_old_flat_keys_are_refused_naming_the_new_one(tmp_path, old, new):
    with pytest.raises(ConfigError, match=rf"config key 'rl.{old}' in override .* is now '{new}'"):
        load_config(TirlConfig, None, [f"rl.{old}=1"])
    f = tmp_path / "old.yaml"
    f.write_text(f"rl:\n  {old}: 1\n")
    with pytest.raises(ConfigError, match=rf"config key 'rl.{old}' is now '{new}' \(`tirl config migrate"):
        load_config(TirlConfig, f)


def _old_config_yaml(**rl: object) -> dict:
    """What an earlier tirl's save_config wrote: every key, the loss and estimator as flat rl.* keys."""
    data = to_dict(TirlConfig())
    flat = {"adv_estimator": "grpo", "policy_loss": "ppo", "clip_low": 0.2, "clip_high": 0.28, "clip_c": 10.0,
            "loss_agg": "token-mean", "loss_norm_len": 0, "token_mean": "exact", "passk_k": 4}  # fmt: skip
    old_rl = {}
    for key, value in data["rl"].items():
        if key == "advantage":
            old_rl.update(
                {k: flat[k] for k in ("adv_estimator", "policy_loss", "clip_low", "clip_high", "clip_c")}
            )
            old_rl.update({k: flat[k] for k in ("loss_agg", "loss_norm_len", "token_mean")})
        elif key != "loss":
            old_rl[key] = value
    old_rl["passk_k"] = flat["passk_k"]
    data["rl"] = old_rl | rl
    return data


def test_migrate_rewrites_an_old_config_yaml_that_then_runs_as_before(tmp_path):
    old = tmp_path / "run" / "config.yaml"
    old.parent.mkdir()
    old.write_text(yaml.safe_dump(_old_config_yaml(policy_loss="gspo", adv_estimator="pkpo", passk_k=2)))
    with pytest.raises(ConfigError, match="is now"):
        load_config(TirlConfig, old)
    new = tmp_path / "new.yaml"
    assert main(["config", "migrate", str(old), "--out", str(new)]) == 0
    rl = load_config(TirlConfig, new).rl
    # the old run's values, written in the old file, not GSPO's defaults; clip_c was ignored by gspo: dropped
    assert to_dict(rl.loss) == {"name": "gspo", "agg": "token-mean", "norm_len": 0, "token_mean": "exact",
                                "clip_low": 0.2, "clip_high": 0.28}  # fmt: skip
    assert to_dict(rl.advantage) == {"name": "pkpo", "k": 2}
    assert migrate_file(new) == []  # current keys: nothing to do, nothing written
    assert "policy_loss: gspo" in old.read_text()  # --out leaves the original as it was
    assert migrate_file(old) and load_config(TirlConfig, old) == load_config(TirlConfig, new)  # in place


def test_migrate_writes_what_a_left_out_key_meant_where_the_new_default_differs(tmp_path):
    f = tmp_path / "config.yaml"
    f.write_text("rl:\n  steps: 3\n  policy_loss: gspo\n  passk_k: 4\n")
    notes = migrate_file(f)
    assert "rl.policy_loss -> rl.loss.name" in notes and any("dropped rl.passk_k" in n for n in notes)
    loss = load_config(TirlConfig, f).rl.loss
    # an old `policy_loss: gspo` ran with the trainer's 0.2 / 0.28 and token-mean
    assert (loss.clip_low, loss.clip_high, loss.agg) == (0.2, 0.28, "token-mean")
    f.write_text("rl:\n  clip_low: 0.1\n  loss: {clip_high: 0.3}\n")
    assert migrate_file(f) == ["rl.clip_low -> rl.loss.clip_low"]
    assert yaml.safe_load(f.read_text()) == {"rl": {"loss": {"clip_high": 0.3, "clip_low": 0.1}}}
    f.write_text("rl:\n  clip_low: 0.1\n  loss: {clip_low: 0.3}\n")
    with pytest.raises(ConfigError, match="'rl.clip_low' and its new name 'rl.loss.clip_low' are both set"):
        migrate_file(f)


@dataclass
class ScaledOptions(LossOptions):
    name: str = "scaled_pg"
    scale: float = 2.0


def scaled_pg(
    logp, old_logp, advantages, loss_mask, *, scale, agg, norm_len=None, num_tokens=None, num_seqs=None
):
    pg = -scale * advantages.expand_as(logp) * logp
    return aggregate(pg, loss_mask, agg, norm_len=norm_len, num_tokens=num_tokens, num_seqs=num_seqs), {}


def test_a_loss_with_its_own_hyperparameter_is_one_function_one_dataclass_one_call(tokenizer, monkeypatch):
    """The newcomer's whole change (docs/architecture.md): nothing in train/ or the config tree learns `scale`."""
    monkeypatch.setattr(POLICY_LOSSES, "_items", dict(POLICY_LOSSES._items))
    register_policy_loss("scaled_pg", scaled_pg, options=ScaledOptions)
    assert _spec("rl.loss.name=scaled_pg").hyper == {"scale": 2.0}
    spec = _spec("rl.loss.name=scaled_pg", "rl.loss.scale=0.5")
    assert spec.hyper == {"scale": 0.5}
    torch.manual_seed(0)
    model = make_model(tokenizer).train()
    batch = collate(
        [[5, 6, 7, 8]], [[0, 1, 1, 1]], pad_id=tokenizer.pad_token_id, extra={"advantages": [[1.0] * 4]}
    )
    half = accumulate_gradients(model, batch, None, None, spec)["loss/total"]
    double = accumulate_gradients(model, batch, None, None, _spec("rl.loss.name=scaled_pg"))["loss/total"]
    assert double == pytest.approx(4 * half)  # the loss read its own scale: 2.0 against 0.5


def test_migrate_moves_the_kl_validation_and_correction_keys_into_their_sections(tmp_path):
    f = tmp_path / "config.yaml"
    old = {"kl_coef": 0.01, "kl_estimator": "k1", "eval_every": 5, "eval_data": ["v.jsonl"], "eval_at_start": True,
           "rollout_correction": "seq_mis", "tis_cap": 3.0, "mis_low": 0.1, "mis_high": 2.0, "steps": 7}  # fmt: skip
    f.write_text(yaml.safe_dump({"rl": old}))
    notes = migrate_file(f)
    assert "rl.kl_coef -> rl.kl.coef" in notes and "rl.rollout_correction -> rl.correction.mode" in notes
    rl = load_config(TirlConfig, f).rl
    assert (rl.kl.coef, rl.kl.estimator, rl.steps) == (0.01, "k1", 7)
    assert (rl.validation.every, rl.validation.data, rl.validation.at_start) == (5, ["v.jsonl"], True)
    assert to_dict(rl.correction) == {"mode": "seq_mis", "tis_cap": 3.0, "mis_low": 0.1, "mis_high": 2.0}
