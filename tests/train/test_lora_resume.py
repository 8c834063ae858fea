"""Resuming a LoRA run: the checkpoint holds the adapter and its base's record; a resumed run continues exactly,
and one pointed at another base is refused."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from conftest import make_model
from tirl.commands.run_config import TirlConfig
from tirl.commands.stages import run_rl
from tirl.core.config import load_config
from tirl.tasks.arith.problems import generate_problems
from tirl.train.manifest import CheckpointError


def _cfg(root, model_dir):
    return load_config(
        TirlConfig,
        None,
        [
            f"model.path={model_dir}", f"rl.data={root / 'rl.jsonl'}", "rl.steps=2", "rl.prompts_per_step=2",
            "rl.n=4", "rl.mini_batch_size=8", "rl.save_every=1", "rl.kl.coef=0.5", "model.lora.rank=4",
            "rl.optim.lr=0.02", "rl.entropy_coef=0.05", "agent.max_response_tokens=12", "agent.max_tokens_per_turn=12",
            "reward.overlong=true", "reward.overlong_buffer=8", "logging.backends=[jsonl]",
        ],
    )  # fmt: skip


def _metrics(out):
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(("time", "perf/"))} for r in rows]


@pytest.mark.slow
def test_lora_run_resumes_exactly_and_checks_its_base(tokenizer, tmp_path):
    make_model(tokenizer).save_pretrained(tmp_path / "base")
    tokenizer.save_pretrained(tmp_path / "base")
    rows = [p.to_row() for p in generate_problems(4, seed=3)]
    (tmp_path / "rl.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    full, cut = tmp_path / "full", tmp_path / "cut"
    torch.manual_seed(0)
    run_rl(_cfg(tmp_path, tmp_path / "base"), full)
    assert {"adapter_model.safetensors", "base_model.json"} <= {
        p.name for p in (full / "checkpoint-1").iterdir()
    }
    shutil.copytree(full / "checkpoint-1", cut / "checkpoint-1")
    torch.manual_seed(1)  # a fresh adapter's initialization differs; the checkpoint's must replace it
    run_rl(_cfg(tmp_path, tmp_path / "base"), cut, resume="auto")
    assert [m["step"] for m in _metrics(cut)] == [1]
    assert _metrics(cut) == _metrics(full)[1:]
    assert (
        _metrics(full)[1]["loss/kl"] > 0
    )  # the entropy bonus moved the adapter even without a reward signal
    wa = load_file(full / "model" / "adapter_model.safetensors")
    wb = load_file(cut / "model" / "adapter_model.safetensors")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    shutil.copytree(tmp_path / "base", tmp_path / "other")  # same weights, another base directory
    with pytest.raises(CheckpointError, match="this run's base"):
        run_rl(_cfg(tmp_path, tmp_path / "other"), tmp_path / "x", resume=str(full / "checkpoint-1"))
