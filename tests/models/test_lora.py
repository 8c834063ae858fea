"""LoRA adapters and export: only the adapter trains, the merged export computes what base + adapter computes, the
disabled adapter is exactly the base, and bad input fails naming the problem."""

import json

import pytest
import torch
from safetensors.torch import load_file

from conftest import make_model
from tirl.cli import main
from tirl.commands.run_config import TirlConfig
from tirl.core.config import ConfigError, load_config
from tirl.models import lora
from tirl.models.export import export_checkpoint, export_hf
from tirl.models.loading import ModelConfig, load_for_inference, load_model, load_policy, save_checkpoint
from tirl.train.logprobs import token_logprobs
from tirl.train.rl.reference import Reference

IDS = torch.randint(0, 200, (2, 12), generator=torch.Generator().manual_seed(0))


@pytest.fixture()
def base_dir(tokenizer, tmp_path):
    make_model(tokenizer, seed=1).save_pretrained(tmp_path / "base")
    tokenizer.save_pretrained(tmp_path / "base")
    return tmp_path / "base"


def _lora_model(base_dir, rank=4, **kw):
    model = load_policy(ModelConfig(path=str(base_dir), lora=lora.LoraConfig(rank=rank, **kw)))
    with torch.no_grad():  # a trained-looking adapter: B is zero at initialization
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05, generator=torch.Generator().manual_seed(len(name)))
    return model.eval()


def test_only_the_adapter_trains_and_every_linear_layer_gets_one(base_dir):
    model = _lora_model(base_dir)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    adapted = {n.split(".")[-4] for n in trainable}  # ...<layer>.lora_A.default.weight
    assert adapted == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    t, total = lora.parameter_counts(model)
    assert 0 < t < total


def test_merged_export_gives_the_logits_of_base_plus_adapter(base_dir, tokenizer, tmp_path):
    model = _lora_model(base_dir)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        expected = model(input_ids=IDS).logits
    export_hf(model, tokenizer, tmp_path / "merged")
    assert not lora.is_adapter_dir(tmp_path / "merged")
    merged = load_model(ModelConfig(path=str(tmp_path / "merged"))).eval()
    with torch.no_grad():
        got = merged(input_ids=IDS).logits
    torch.testing.assert_close(got, expected)
    assert (got - load_model(ModelConfig(path=str(base_dir)))(input_ids=IDS).logits).abs().max() > 1e-3
    after = model.state_dict()  # exporting did not touch the live model
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)


def test_checkpoint_holds_the_adapter_and_exports_merged(base_dir, tokenizer, tmp_path):
    model = _lora_model(base_dir)
    save_checkpoint(model, tokenizer, tmp_path / "ckpt")
    files = {p.name for p in (tmp_path / "ckpt").iterdir()}
    assert {lora.ADAPTER_WEIGHTS, lora.ADAPTER_CONFIG, lora.BASE_RECORD} <= files
    assert "model.safetensors" not in files  # the adapter only, not a copy of the base
    assert json.loads((tmp_path / "ckpt" / lora.BASE_RECORD).read_text())["path"] == str(base_dir.resolve())
    assert main(["export", str(tmp_path / "ckpt"), "--out", str(tmp_path / "out")]) == 0
    with torch.no_grad():
        expected = model(input_ids=IDS).logits
        got = load_model(ModelConfig(path=str(tmp_path / "out")))(input_ids=IDS).logits
        evaluated = load_for_inference(ModelConfig(), tmp_path / "ckpt")(input_ids=IDS).logits  # tirl eval's
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(evaluated, expected)


def test_disabled_adapter_is_exactly_the_base(base_dir):
    model = _lora_model(base_dir)
    base = load_model(ModelConfig(path=str(base_dir))).eval()
    mask = torch.ones_like(IDS)
    ref = Reference(model)
    assert ref.shares_weights  # no copy of the weights
    with torch.no_grad(), ref.model() as m:
        got, _ = token_logprobs(m, IDS, mask)
        want, _ = token_logprobs(base, IDS, mask)
    with torch.no_grad():
        adapted, _ = token_logprobs(model, IDS, mask)  # the adapter is back on after the block
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert (adapted - want).abs().max() > 1e-4


def test_full_model_reference_is_a_frozen_copy_in_ref_dtype(tokenizer):
    policy = make_model(tokenizer)
    ref = Reference(policy, torch.bfloat16)
    with ref.model() as m:
        assert m is not policy and next(m.parameters()).dtype == torch.bfloat16
        assert not any(p.requires_grad for p in m.parameters())
    assert next(policy.parameters()).dtype == torch.float32


def test_bad_lora_settings_fail_naming_the_key(base_dir):
    with pytest.raises(ConfigError, match="lora.rank"):
        load_config(TirlConfig, None, ["model.lora.rank=-1"])
    with pytest.raises(ConfigError, match="ref_dtype"):
        load_config(TirlConfig, None, ["model.lora.rank=8", "model.ref_dtype=bfloat16"])
    with pytest.raises(ConfigError, match="autocast"):
        load_config(TirlConfig, None, ["model.autocast=bfloat16", "model.dtype=bfloat16"])
    with pytest.raises(ConfigError, match="autocast"):
        load_config(TirlConfig, None, ["model.autocast=float16"])
    with pytest.raises(ValueError, match=r"target_modules: \['qkv'\].*q_proj"):
        load_policy(ModelConfig(path=str(base_dir), lora=lora.LoraConfig(rank=2, target_modules=["qkv"])))
    only_q = load_policy(
        ModelConfig(path=str(base_dir), lora=lora.LoraConfig(rank=2, target_modules=["q_proj"]))
    )
    assert {n.split(".")[-4] for n, p in only_q.named_parameters() if p.requires_grad} == {"q_proj"}


def test_export_and_training_refuse_what_they_cannot_use(base_dir, tokenizer, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["export", str(tmp_path / "empty"), "--out", str(tmp_path / "x")]) == 2
    assert "not a model checkpoint" in capsys.readouterr().err
    model = _lora_model(base_dir)
    save_checkpoint(model, tokenizer, tmp_path / "ckpt")
    with pytest.raises(ValueError, match="is a LoRA adapter.*tirl export"):
        load_policy(ModelConfig(path=str(tmp_path / "ckpt")))
    with pytest.raises(ValueError, match="is the checkpoint itself"):
        export_checkpoint(tmp_path / "ckpt", tmp_path / "ckpt")
    # the base changed after training: the adapter no longer fits it, and export says so
    make_model(tokenizer, seed=2).save_pretrained(base_dir)
    cfg = json.loads((base_dir / "config.json").read_text())
    (base_dir / "config.json").write_text(json.dumps({**cfg, "rms_norm_eps": 1e-5}))
    with pytest.raises(lora.LoraError, match="not the one this adapter was trained on"):
        export_checkpoint(tmp_path / "ckpt", tmp_path / "y")


def test_exported_full_model_drops_trainer_files(tokenizer, tmp_path):
    model = make_model(tokenizer)
    save_checkpoint(model, tokenizer, tmp_path / "ckpt", extra={"step": 3})
    export_checkpoint(tmp_path / "ckpt", tmp_path / "out")
    assert not (tmp_path / "out" / "trainer_state.pt").exists()
    a, b = (
        load_file(tmp_path / "ckpt" / "model.safetensors"),
        load_file(tmp_path / "out" / "model.safetensors"),
    )
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
