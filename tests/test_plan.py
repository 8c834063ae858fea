"""`tirl plan`: parameter counts and memory against numbers computed by hand, the activation formula against what
autograd really saves, config errors caught before a run, and the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tirl.commands.run_config import TirlConfig
from tirl.core.config import load_config
from tirl.rollout.engines.spec import GIB
from tirl.train.memory import activation_values_per_token
from tirl.train.plan import PlanError, plan

CONFIGS = Path(__file__).resolve().parents[1] / "src" / "tirl" / "configs"
QWEN3_4B = "qwen3-4b-instruct-2507"


def recipe(name: str, *overrides: str) -> TirlConfig:
    """A recipe config as it ships (the RL ones sample with vLLM)."""
    return load_config(TirlConfig, CONFIGS / f"recipe-{name}.yaml", list(overrides))


def test_parameter_counts_are_the_hand_computed_ones():
    """Qwen3-4B: embedding 151936 x 2560 (tied with the head); per layer q 2560x4096, k and v 2560x1024, o 4096x2560,
    q/k norms 128 each, two RMSNorms 2560 each, gate/up/down 3 x 2560x9728; 36 layers and a final norm.
    Qwen2.5-7B: untied embedding and head 152064 x 3584 each; per layer q 3584x3584 (+bias), k/v 3584x512 (+bias),
    o 3584x3584, norms 2 x 3584, MLP 3 x 3584x18944; 28 layers and a final norm."""
    layer4b = 2560 * 4096 + 2 * 2560 * 1024 + 4096 * 2560 + 2 * 128 + 2 * 2560 + 3 * 2560 * 9728
    qwen3_4b = 151936 * 2560 + 36 * layer4b + 2560
    layer7b = (3584 * 3584 + 3584) + 2 * (3584 * 512 + 512) + 3584 * 3584 + 2 * 3584 + 3 * 3584 * 18944
    qwen25_7b = 2 * 152064 * 3584 + 28 * layer7b + 3584
    assert (qwen3_4b, qwen25_7b) == (4_022_468_096, 7_615_616_512)
    assert plan(recipe("qwen3-4b-grpo-tcr"), processes=8, arch=QWEN3_4B).params == qwen3_4b
    p7 = plan(recipe("qwen2.5-7b-grpo-tcr"), processes=8, arch="qwen2.5-7b-instruct")
    assert p7.params == p7.trainable == qwen25_7b


def test_recipe_memory_matches_the_hand_computation():
    """GRPO-TCR on Qwen3-4B, 8 processes, fp32 master weights + bf16 autocast, checkpointing, 23040-token
    micro-batches, computed by hand:
      weights   4,022,468,096 x 4 B / 8                         = 2,011,234,048 B
      gradients the same; AdamW 2 x that                        = 4,022,468,096 B
      gathered  2 x the embedding (151936 x 2560) x 2 B         = 1,555,824,640 B
      activations per token: layer inputs 36 x 2560 = 92,160, one layer recomputed
                4 x 2560 + 6 x (4096 + 1024) + 4 x 9728 = 79,872, final hidden 2,560: 174,592 values
                x 2 B x 23,040 tokens                           = 8,045,199,360 B
      log-prob head: a float32 row of logits and the hidden state kept per token,
                23,040 x (151936 + 2560) x 4 B, and one chunk's transient logits and gradient,
                2 x 1024 x 151936 x 4 B                          = 15,483,011,072 B"""
    p = plan(recipe("qwen3-4b-grpo-tcr"), processes=8, arch=QWEN3_4B, gpu_gib=80, reserve_gib=1.5)
    expected = {
        "weights_gib": 2_011_234_048,
        "grads_gib": 2_011_234_048,
        "optimizer_gib": 4_022_468_096,
        "gathered_gib": 1_555_824_640,
        "activations_gib": 8_045_199_360,
        "logits_gib": 15_483_011_072,
        "reference_gib": 0,
    }
    for key, value in expected.items():
        assert getattr(p, key) == pytest.approx(value / GIB, rel=1e-9), key
    assert p.total_gib == pytest.approx(sum(expected.values()) / GIB + 1.5, rel=1e-9)
    assert p.fits and p.sequence_tokens == 2560 + 20480 and p.tokens_per_micro_batch == 23040


def test_lora_trains_the_hand_counted_adapter_and_needs_no_reference_copy():
    """Rank 16 on all linear layers of Qwen3-4B: per layer 16 x ((2560+4096) + 2 (2560+1024) + (4096+2560)
    + 2 (2560+9728) + (9728+2560)) = 917,504, x 36 layers = 33,030,144 (the head is not adapted)."""
    cfg = recipe("qwen3-4b-grpo-tcr", "model.lora.rank=16", "rl.kl.coef=0.001")
    p = plan(cfg, processes=1, arch=QWEN3_4B)
    assert p.trainable == 33_030_144
    assert p.params == 4_022_468_096 and p.reference_gib == 0.0
    assert p.optimizer_gib == pytest.approx(2 * 33_030_144 * 4 / GIB)
    full = plan(recipe("qwen3-4b-grpo-tcr", "rl.kl.coef=0.001"), processes=1, arch=QWEN3_4B)
    assert full.reference_gib == pytest.approx(4_022_468_096 * 4 / GIB) and full.total_gib > p.total_gib


@pytest.mark.parametrize("model_type", ["qwen2", "qwen3"])
def test_activation_formula_matches_what_autograd_saves(model_type):
    from transformers import AutoModelForCausalLM, Qwen2Config, Qwen3Config

    kw = dict(
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=300,
    )
    cfg = Qwen3Config(head_dim=32, **kw) if model_type == "qwen3" else Qwen2Config(**kw)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").train()
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    ids = torch.randint(0, 300, (2, 256))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model.model(input_ids=ids)
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    measured = sum(n for ptr, n in saved.items() if ptr not in weights)
    estimate = activation_values_per_token(cfg, checkpointing=False) * 4 * ids.numel()
    assert estimate == pytest.approx(measured, rel=0.05)


def test_config_errors_fail_in_the_plan():
    with pytest.raises(PlanError, match="prompts_per_step=64 must divide over 6"):
        plan(recipe("qwen3-4b-grpo-tcr"), processes=6, arch=QWEN3_4B)
    with pytest.raises(PlanError, match="micro_batch_tokens=8192 is below one full sequence"):
        plan(recipe("qwen3-4b-grpo-tcr", "rl.micro_batch_tokens=8192"), processes=8, arch=QWEN3_4B)
    with pytest.raises(PlanError, match="max_position_embeddings is 32768"):
        plan(
            recipe("qwen2.5-7b-grpo-tcr", "agent.max_response_tokens=40000", "rl.micro_batch_tokens=0"),
            arch="qwen2.5-7b-instruct",
        )
    with pytest.raises(PlanError, match="has no config.json.*--arch"):
        plan(recipe("qwen3-4b-grpo-tcr"), processes=8)
    with pytest.raises(PlanError, match="rollout.engine=openai cannot receive the policy's new weights"):
        plan(
            recipe("qwen3-4b-grpo-tcr", "rollout.engine=openai", "rollout.urls=[http://x]", "rollout.model_name=m"),
            processes=8, arch=QWEN3_4B,
        )  # fmt: skip
    with pytest.raises(PlanError, match="neither a config.json file nor one of"):
        plan(recipe("qwen3-4b-grpo-tcr"), processes=8, arch="qwen9-1t")


def test_lora_over_processes_shards_base_and_adapter():
    """LoRA under torchrun: the frozen base and the adapter (with its gradients and AdamW state) are sharded alike,
    and no reference copy is planned (the base with the adapter off is the reference)."""
    full = plan(recipe("qwen3-4b-grpo-tcr", "rollout.engine=torch"), processes=8, arch=QWEN3_4B)
    one = plan(
        recipe("qwen3-4b-grpo-tcr", "rollout.engine=torch", "model.lora.rank=8"), processes=1, arch=QWEN3_4B
    )
    eight = plan(
        recipe("qwen3-4b-grpo-tcr", "rollout.engine=torch", "model.lora.rank=8"), processes=8, arch=QWEN3_4B
    )
    assert eight.trainable == one.trainable < full.trainable / 100
    assert eight.optimizer_gib == pytest.approx(one.optimizer_gib / 8)
    assert eight.weights_gib == pytest.approx(one.weights_gib / 8)
    assert eight.reference_gib == 0 and eight.total_gib < full.total_gib


def test_the_torch_engine_counts_its_kv_cache_beside_the_trainer():
    """The torch engine decodes in the trainer's process: a rank's rows (at most rollout.torch.max_batch_size) at
    full length, in the decode's dtype (bf16 autocast: 2 B), plus the kept prefixes, on top of the resident state.
    Qwen3-4B: 36 layers x 8 KV heads x 128 x 2 (K, V) x 2 B = 147,456 B a position."""
    rows = 64 * 16 // 8
    for max_rows, want_rows in ((256, rows), (8, 8)):
        cfg = recipe("qwen3-4b-grpo-tcr", "rollout.engine=torch", f"rollout.torch.max_batch_size={max_rows}")
        p = plan(cfg, processes=8, arch=QWEN3_4B, gpu_gib=80)
        kv = want_rows * 23040 * 147_456 / GIB
        assert p.rollout_gib == pytest.approx(kv + 1.0), max_rows  # + keep_prefix_mib 1024
        assert f"KV cache of {want_rows} rows x 23040 positions" in p.rollout_engine
    assert not plan(recipe("qwen3-4b-grpo-tcr", "rollout.engine=torch"), processes=8, arch=QWEN3_4B).fits
    assert plan(cfg, processes=8, arch=QWEN3_4B, gpu_gib=80).fits  # 8 rows: 25 GiB beside the trainer's 18


def test_every_recipe_config_loads_and_plans():
    for path in sorted(CONFIGS.glob("recipe-*.yaml")):
        cfg = load_config(TirlConfig, path, [])
        arch = QWEN3_4B if "qwen3" in path.name else "qwen2.5-7b-instruct"
        p = plan(cfg, stage="sft" if "-sft" in path.name else "rl", processes=8, arch=arch)
        assert p.fits, (path.name, p.total_gib)


def test_a_local_model_directory_is_counted_exactly(tmp_path):
    from transformers import AutoModelForCausalLM, Qwen2Config

    cfg = Qwen2Config(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=500,
        tie_word_embeddings=True,
    )
    model = AutoModelForCausalLM.from_config(cfg)
    model.save_pretrained(tmp_path / "m")
    run = load_config(TirlConfig, None, [f"model.path={tmp_path / 'm'}", "agent.max_prompt_tokens=64"])
    p = plan(run, processes=1)
    assert p.params == sum(x.numel() for x in model.parameters()) and p.gathered_gib == 0


def test_cli_prints_the_plan_and_exits_3_when_it_does_not_fit(capsys):
    from tirl.cli import main

    argv = [
        "plan",
        "--config",
        str(CONFIGS / "recipe-qwen2.5-7b-grpo-tcr.yaml"),
        "--arch",
        "qwen2.5-7b-instruct",
    ]
    assert main([*argv, "--nproc", "8", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["params"] == 7_615_616_512
    assert main([*argv, "--nproc", "8", "--gpu-gib", "16"]) == 3
    assert "DOES NOT FIT" in capsys.readouterr().out
    assert main([*argv, "--nproc", "6"]) == 2
    assert "must divide over 6 processes" in capsys.readouterr().err


def test_the_installed_command_runs():
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "tirl",
            "plan",
            "--stage",
            "sft",
            "--config",
            str(CONFIGS / "recipe-qwen3-4b-sft.yaml"),
            "--arch",
            QWEN3_4B,
            "--nproc",
            "8",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0 and "4,022,468,096" in out.stdout, out.stderr


def test_a_non_json_arch_file_is_named(tmp_path, capsys):
    from tirl.cli import main

    bad = tmp_path / "arch.yaml"
    bad.write_text('{"model_type": "qwen2"}\n{"extra": 1}\n')
    assert main(["plan", "--arch", str(bad)]) == 2
    assert f"--arch {bad}: not a JSON config.json (Extra data: line 2" in capsys.readouterr().err


def test_vllm_memory_separate_and_colocated():
    """Qwen3-4B served in bfloat16 (the recipe config's rollout.dtype): 4,022,468,096 x 2 bytes of weights per
    engine; KV cache per token 2 (k, v) x 36 layers x 8 kv heads x 128 x 2 bytes; a step's 64 x 16 trajectories,
    64 in flight per rank (rollout.concurrency)."""
    weights = 4_022_468_096 * 2 / GIB
    kv_token = 2 * 36 * 8 * 128 * 2
    seq = 2560 + 20480
    sep = plan(
        recipe("qwen3-4b-grpo-tcr", "rollout.engine=vllm", "rollout.urls=[http://a:1,http://b:1]",
               "rollout.vllm.kv_cache_gib=20", "rl.prompts_per_step=48", "rl.mini_batch_size=192"),
        processes=6, arch=QWEN3_4B,
    )  # fmt: skip
    assert sep.rollout_gib == pytest.approx(weights + 20)
    want = min(48 * 16 // 2, 64 * 3) * seq * kv_token / GIB  # 3 ranks share each of the 2 servers
    assert "2 vLLM server(s) on GPUs of their own beside the 6 training GPUs (8 in all)" in sep.rollout_engine
    assert f"want {want:.2f}" in sep.rollout_engine and sep.fits
    col = plan(recipe("qwen3-4b-grpo-tcr", "rollout.engine=vllm", "rollout.vllm.placement=colocated"), processes=8,
               arch=QWEN3_4B)  # fmt: skip
    assert col.rollout_gib == pytest.approx(0.75 * 80)  # the recipe's --gpu-memory-utilization=0.75
    resident = col.weights_gib + col.gathered_gib + col.grads_gib + col.optimizer_gib + col.reserve_gib
    assert f"resident {resident:.2f} GiB: {resident + 60:.2f} GiB of 80" in col.rollout_engine and col.fits
    tight = plan(
        recipe("qwen3-4b-grpo-tcr", "rollout.engine=vllm", "rollout.vllm.placement=colocated", "rollout.vllm.kv_cache_gib=50"),
        processes=8, arch=QWEN3_4B, gpu_gib=64,
    )  # fmt: skip
    assert tight.total_gib < 64 and not tight.fits  # the update fits, the awake engine on top of it does not


def test_colocated_engine_kwargs_from_server_flags():
    from tirl.rollout.engines.vllm.colocated import engine_kwargs

    got = engine_kwargs(["--gpu-memory-utilization=0.75", "--max-model-len=23040", "--enforce-eager"], 1.5)
    assert got == {
        "gpu_memory_utilization": 0.75, "max_model_len": 23040, "enforce_eager": True,
        "kv_cache_memory_bytes": int(1.5 * 2**30),
    }  # fmt: skip
    with pytest.raises(ValueError, match="'4096' is not a --flag"):
        engine_kwargs(["4096"], 0)
