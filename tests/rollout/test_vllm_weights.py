"""Directories for the vLLM engine, without vLLM: tied embeddings untied, the policy written whole, what is servable."""

from __future__ import annotations

import json

import torch
from safetensors import safe_open

from conftest import make_model
from tirl.rollout.engines.vllm.weights import (
    INDEX,
    LM_HEAD,
    LM_HEAD_FILE,
    is_plain_hf_dir,
    ties_embeddings,
    untied_copy,
    write_weights,
)


def _tensor(path, key):
    with safe_open(str(path), framework="pt") as h:
        return h.get_tensor(key)


def test_untied_copy_carries_the_embedding_as_lm_head(tokenizer, tmp_path):
    model = make_model(tokenizer)
    src = tmp_path / "m"
    model.save_pretrained(src)
    tokenizer.save_pretrained(src)
    (src / INDEX).write_text(json.dumps({"weight_map": {"model.embed_tokens.weight": "model.safetensors"}}))
    assert ties_embeddings(src) and is_plain_hf_dir(src)
    out = untied_copy(src, tmp_path / "untied")
    assert not ties_embeddings(out)
    assert json.loads((src / "config.json").read_text()).get("tie_word_embeddings", True)  # source untouched
    assert (out / "model.safetensors").is_symlink() and not (out / "config.json").is_symlink()
    torch.testing.assert_close(_tensor(out / LM_HEAD_FILE, LM_HEAD), model.get_input_embeddings().weight)
    assert json.loads((out / INDEX).read_text())["weight_map"][LM_HEAD] == LM_HEAD_FILE
    assert json.loads((src / INDEX).read_text())["weight_map"] == {
        "model.embed_tokens.weight": "model.safetensors"
    }


def test_write_weights_replaces_the_directory_whole(tokenizer, tmp_path):
    model = make_model(tokenizer)
    out = tmp_path / "weights"
    write_weights(model, out, untie_embeddings=True)
    with torch.no_grad():
        model.get_input_embeddings().weight.add_(1.0)
    write_weights(model, out, untie_embeddings=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["weights"]  # no staging or old copy left behind
    torch.testing.assert_close(_tensor(out / LM_HEAD_FILE, LM_HEAD), model.get_input_embeddings().weight)
    torch.testing.assert_close(
        _tensor(out / "model.safetensors", "model.embed_tokens.weight"), model.get_input_embeddings().weight
    )


def test_adapter_directories_are_not_servable(tmp_path):
    for name in ("config.json", "adapter_config.json", "adapter_model.safetensors", "tokenizer_config.json"):
        (tmp_path / name).write_text("{}")
    assert not is_plain_hf_dir(tmp_path)
    (tmp_path / "adapter_config.json").unlink()
    assert is_plain_hf_dir(tmp_path)
    assert not is_plain_hf_dir("")
