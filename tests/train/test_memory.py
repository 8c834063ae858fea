"""`micro_batch_tokens: auto`: the budget rule, the head's accounting against what autograd keeps, and the
trainers sizing their micro-batches from it."""

import pytest
import torch

from conftest import make_model
from tirl.core.padding import least_padding_split
from tirl.train import memory
from tirl.train.batch import micro_batches, micro_batches_by_length
from tirl.train.logprobs import token_logprobs
from tirl.train.memory import (
    GIB,
    MicroBatchBudget,
    budget_bytes,
    resolve_micro_batch_tokens,
    tokens_for_budget,
)
from tirl.train.rl.trainer import RLConfig
from tirl.train.sft import SFTConfig


def test_cpu_budget_is_one_gib_unless_memory_is_short(monkeypatch):
    monkeypatch.setattr(memory, "cpu_memory_bytes", lambda: 20 * GIB)
    assert budget_bytes("cpu")[0] == GIB
    monkeypatch.setattr(memory, "cpu_memory_bytes", lambda: 2 * GIB)
    got, why = budget_bytes("cpu")
    assert got == GIB // 2 and "quarter of the machine's 2.0 GiB" in why
    monkeypatch.setattr(memory, "cpu_memory_bytes", lambda: None)  # unreadable: the fixed cap
    assert budget_bytes("cpu")[0] == GIB
    assert budget_bytes("cpu", activation_gib=3.0)[0] == 3 * GIB  # an explicit budget wins
    assert budget_bytes("cuda", device_gib=80.0)[0] == 20 * GIB


def test_cgroup_limit_bounds_the_machine_memory(monkeypatch):
    monkeypatch.setattr(memory, "_meminfo_total", lambda: 20 * GIB)
    monkeypatch.setattr(memory, "_cgroup_limit", lambda: 3 * GIB)
    assert memory.cpu_memory_bytes() == 3 * GIB
    monkeypatch.setattr(memory, "_cgroup_limit", lambda: None)
    assert memory.cpu_memory_bytes() == 20 * GIB


def test_tokens_follow_the_budget_and_the_model(tokenizer):
    cfg = make_model(tokenizer).config
    one = tokens_for_budget(cfg, GIB, checkpointing=False, compute_bytes=4, chunk_tokens=1024)
    two = tokens_for_budget(cfg, 2 * GIB, checkpointing=False, compute_bytes=4, chunk_tokens=1024)
    assert 1.9 < two / one < 2.2  # linear in the budget beyond the head's fixed part
    half = tokens_for_budget(cfg, GIB, checkpointing=False, compute_bytes=2, chunk_tokens=1024)
    assert half > one  # bf16 activations: more tokens
    assert (
        tokens_for_budget(cfg, 1, checkpointing=False, compute_bytes=4, chunk_tokens=1024)
        == memory.MIN_TOKENS
    )


def test_head_keeps_the_hidden_rows_not_the_logits(tokenizer):
    """What autograd saves in the chunked head beyond the decoder's hidden states is what `head_bytes` counts: a
    hidden row and a few numbers per trained token (the backward recomputes the logits)."""
    torch.manual_seed(0)
    model = make_model(tokenizer).train()
    V = model.config.vocab_size
    ids = torch.randint(3, V, (4, 40))
    mask = torch.ones_like(ids, dtype=torch.float32)
    decoder_saved: dict[int, int] = {}
    saved: dict[int, int] = {}

    def pack(into):
        def f(t):
            into[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        return f

    with torch.autograd.graph.saved_tensors_hooks(pack(decoder_saved), lambda t: t):
        model.get_decoder()(input_ids=ids, attention_mask=torch.ones_like(ids))
    with torch.autograd.graph.saved_tensors_hooks(pack(saved), lambda t: t):
        token_logprobs(model, ids, torch.ones_like(ids), loss_mask=mask, chunk_tokens=64)
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    total = sum(n for p, n in saved.items() if p not in weights)
    decoder = sum(n for p, n in decoder_saved.items() if p not in weights)
    trained = 4 * 39  # position 0 predicts nothing
    kept = memory.head_bytes(trained, model.config, 0)  # without the transient chunk
    assert total - decoder == pytest.approx(kept, rel=0.05)


def test_fixed_numbers_and_zero_pass_through(tokenizer):
    model = make_model(tokenizer)
    assert resolve_micro_batch_tokens(4096, model) == MicroBatchBudget(4096, source="micro_batch_tokens")
    assert resolve_micro_batch_tokens(0, model).tokens == 0
    auto = resolve_micro_batch_tokens("auto", model, activation_gib=0.001)
    assert auto.tokens >= memory.MIN_TOKENS and "activation_gib=0.001" in auto.describe()


def test_configs_take_auto_numbers_and_refuse_the_rest():
    assert RLConfig().micro_batch_tokens == "auto" and SFTConfig().micro_batch_tokens == "auto"
    assert RLConfig(micro_batch_tokens=0).micro_batch_tokens == 0
    with pytest.raises(ValueError, match="micro_batch_tokens >= 0 or auto"):
        RLConfig(micro_batch_tokens=-5)
    with pytest.raises(ValueError, match="micro_batch_tokens >= 0 or auto"):
        SFTConfig(micro_batch_tokens="big")


def test_token_budget_groups_similar_lengths_and_keeps_each_part_in_order():
    lengths = [30, 5, 28, 6, 29, 4]
    parts = micro_batches_by_length(lengths, max_tokens=60)
    assert parts == [[1, 3, 5], [2, 4], [0]]  # shortest first, each part's rows in their own order
    padded = sum(len(p) * max(lengths[i] for i in p) for p in parts)
    in_order = sum(len(p) * max(lengths[i] for i in p) for p in micro_batches(lengths, max_tokens=60))
    assert padded < in_order
    assert micro_batches_by_length(lengths, max_seqs=2, max_tokens=60) == micro_batches(
        lengths, max_seqs=2, max_tokens=60
    )  # a fixed micro-batch size splits in order, as verl does
    assert micro_batches_by_length(lengths) == [list(range(6))]


def _cost(lengths, ends, pass_cost):
    return sum(lengths[b - 1] * (b - a) + pass_cost for a, b in zip([0, *ends[:-1]], ends))


@pytest.mark.parametrize("seed", range(20))
def test_least_padding_split_is_the_cheapest_within_the_budget(seed):
    """Against every way of cutting a short ascending list: the least padded tokens plus pass cost."""
    import itertools
    import random

    rng = random.Random(seed)
    lengths = sorted(rng.randint(1, 40) for _ in range(rng.randint(1, 9)))
    cap, pass_cost = rng.choice([30, 60, 200]), rng.choice([0, 8, 64])
    ends = least_padding_split(lengths, cap, pass_cost)
    n = len(lengths)
    every = [[*cuts, n] for k in range(n) for cuts in itertools.combinations(range(1, n), k)]
    fits = [
        e for e in every if all(lengths[b - 1] * (b - a) <= cap or b - a == 1 for a, b in zip([0, *e], e))
    ]
    assert ends[-1] == n and ends in fits
    assert _cost(lengths, ends, pass_cost) == min(_cost(lengths, e, pass_cost) for e in fits)


def test_demo_sft_batches_lose_little_to_padding():
    """A batch of 32 rows with the demo SFT data's spread of lengths (44-266 tokens): split by least padding, its
    passes hold at most 1.2x the real tokens, where one pass holds 2x or more."""
    import random

    rng = random.Random(0)
    lengths = [rng.randint(44, 120) for _ in range(28)] + [rng.randint(150, 266) for _ in range(4)]
    parts = micro_batches_by_length(lengths, max_tokens=13_243)
    padded = sum(len(p) * max(lengths[i] for i in p) for p in parts)
    assert padded < 1.2 * sum(lengths) and max(lengths) * len(lengths) > 2 * sum(lengths)
    assert sorted(i for p in parts for i in p) == list(range(32)) and len(parts) <= 5


@pytest.mark.parametrize("autocast", ["none", "bfloat16"])
def test_plan_reports_the_budget_the_trainer_uses(tokenizer, tmp_path, monkeypatch, autocast):
    from tirl.commands.run_config import TirlConfig
    from tirl.models.loading import ModelConfig
    from tirl.train.plan import plan

    monkeypatch.setattr(memory, "cpu_memory_bytes", lambda: 64 * GIB)
    model = make_model(tokenizer)
    model.save_pretrained(tmp_path)
    mc = ModelConfig(path=str(tmp_path), autocast=autocast, activation_gib=0.05)
    cfg = TirlConfig(model=mc)
    cfg.agent.max_response_tokens, cfg.agent.max_prompt_tokens = 480, 32  # the whole mini-batch: 32k tokens
    trainer_side = resolve_micro_batch_tokens(
        "auto", model, autocast=mc.autocast_dtype(model.config.hidden_size), activation_gib=0.05
    )
    assert 512 < trainer_side.tokens < cfg.rl.mini_batch_size * 512  # the budget binds
    p = plan(cfg, stage="rl")
    assert p.tokens_per_micro_batch == trainer_side.tokens
    assert "activation_gib=0.05" in p.tokens_source
