"""`tirl serve-vllm`: a server for trainers on other machines, started as tirl starts its own (fast: the command
line it would exec; the slow multi-node test, tests/train/test_multinode.py, runs it for real)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tirl.rollout.engines.vllm.ext.tirl_weight_receiver import KEY_ENV

SRC = Path(__file__).resolve().parents[2] / "src"


def serve(*args: str, key: str = "k" * 64, python: str = sys.executable) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(SRC), "CUDA_VISIBLE_DEVICES": "", KEY_ENV: key}
    cmd = [sys.executable, "-m", "tirl", "serve-vllm", "--python", python, *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def model_dir(tokenizer, tmp_path_factory) -> Path:
    from tirl.models.tiny import TinyModelConfig, build_model

    path = tmp_path_factory.mktemp("serve-vllm") / "model"
    build_model(tokenizer, TinyModelConfig(num_layers=1), seed=0).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_the_command_line_binds_the_given_address_with_receiver_and_key(model_dir, tmp_path):
    r = serve(
        str(model_dir), "--host", "10.1.2.3", "--port", "8123", "--print", "--vllm-arg=--max-model-len=512"
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    argv = out["argv"]
    assert argv[:3] == [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
    assert argv[argv.index("--host") + 1] == "10.1.2.3" and argv[argv.index("--port") + 1] == "8123"
    assert argv[argv.index("--dtype") + 1] == "float32"  # no GPU: the CPU trainer's dtype
    assert argv[argv.index("--worker-extension-cls") + 1] == "tirl_weight_receiver.WeightReceiver"
    assert argv[argv.index("--middleware") + 1] == "tirl_vllm_auth.RequireKey"
    assert "--logprobs-mode" in argv and "--enforce-eager" in argv and argv[-1] == "--max-model-len=512"
    assert "k" * 64 not in " ".join(argv)  # the key travels in the environment only
    served = argv[argv.index("--model") + 1]
    assert (served != str(model_dir)) == out["untied"]  # a tied model is served from its untied copy


@pytest.mark.parametrize(
    ("args", "key", "message"),
    [
        (["--port", "0"], "k", "--port must be in 1..65535"),
        (["--kv-cache-gib", "-1"], "k", "--kv-cache-gib must be >= 0"),
        ([], "", "TIRL_VLLM_API_KEY is empty"),
    ],
)
def test_bad_settings_are_refused_naming_them(model_dir, args, key, message):
    r = serve(str(model_dir), *args, "--print", key=key)
    assert r.returncode == 2 and message in r.stderr, r.stderr


def test_a_directory_vllm_cannot_serve_is_refused(tmp_path):
    (tmp_path / "ckpt").mkdir()
    r = serve(str(tmp_path / "ckpt"), "--print")
    assert r.returncode == 2 and "no Hugging Face model directory" in r.stderr, r.stderr


def test_vllm_sockets_go_where_their_names_fit(tmp_path, monkeypatch):
    """vLLM names its unix sockets DIR/<uuid4>, and a socket's name holds 107 bytes: under a deep temporary
    directory (a node's own, say) the sockets' directory goes to /tmp instead."""
    import tempfile

    from tirl.rollout.engines.vllm.command import private_ipc_dir

    deep = tmp_path / ("d" * 60)
    deep.mkdir()
    for base, parent in ((deep, Path("/tmp")), (Path("/tmp"), Path("/tmp"))):
        monkeypatch.setattr(tempfile, "tempdir", str(base))
        made = Path(private_ipc_dir())
        try:
            assert made.parent == parent and made.stat().st_mode & 0o777 == 0o700
            assert len(f"{made}/{'x' * 36}") <= 107
        finally:
            made.rmdir()
