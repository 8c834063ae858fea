"""Decode over packed weights (`tirl.rollout.engines.torch.packed`): bf16 packs give autocast's numbers to bf16 rounding and fp32
packs plain `F.linear`'s to float rounding, packs follow in-place weight updates, the module's own forward runs
wherever the packed path does not apply, and `rollout.torch.pack` decides where the engine packs."""

import threading

import pytest
import torch

from tirl.models.tiny import TinyModelConfig, build_model
from tirl.rollout.engines.torch import packed as packed_mod
from tirl.rollout.engines.torch.config import TorchEngineConfig
from tirl.rollout.engines.torch.engine import TorchEngine
from tirl.rollout.engines.torch.packed import MAX_ROWS, PackedLinears, packing_available
from tirl.rollout.sampling import SamplingParams
from tirl.train.batch import collate
from tirl.train.logprobs import token_logprobs

pytestmark = pytest.mark.skipif(
    not packing_available(), reason="no oneDNN packed bf16 linear in this PyTorch build"
)


def _mlp(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(32, 48), torch.nn.SiLU(), torch.nn.Linear(48, 16, bias=False))


def _autocast():
    return torch.autocast("cpu", dtype=torch.bfloat16)


def test_packed_forward_gives_autocast_numbers_and_restores_the_modules():
    model, x = _mlp(), torch.randn(5, 32)
    with torch.no_grad(), _autocast():
        ref = model(x)
        with PackedLinears(model).active():
            out = model(x)
    assert out.dtype == ref.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ref.float(), atol=2e-2, rtol=2e-2)
    assert not any("forward" in m.__dict__ for m in model.modules())  # the class's forward again


def test_packs_follow_in_place_weight_updates():
    model, x = _mlp(), torch.randn(3, 32)
    packer = PackedLinears(model)
    with torch.no_grad(), _autocast():
        with packer.active():
            before = model(x)
        model[0].weight.mul_(-1.0)  # what an optimizer step does: an in-place update
        with packer.active():
            after = model(x)
        ref = model(x)
    torch.testing.assert_close(after.float(), ref.float(), atol=2e-2, rtol=2e-2)
    assert not torch.allclose(before.float(), after.float(), atol=0.1)


def test_grad_and_large_passes_take_the_module_forward():
    model = _mlp()
    packer = PackedLinears(model)
    with packer.active():
        y = model(torch.randn(4, 32))  # grad enabled: a training forward
        assert y.requires_grad and y.dtype == torch.float32
        with torch.no_grad():
            big = torch.randn(MAX_ROWS + 1, 32)
            assert torch.equal(model(big), torch.nn.Sequential.forward(model, big))


def test_concurrent_contexts_share_the_packs():
    """The async agent loop calls generate from threads: the modules stay patched until the last context exits."""
    model, x = _mlp(), torch.randn(2, 32)
    packer = PackedLinears(model)
    inside, release, errors = threading.Event(), threading.Event(), []

    def hold():
        try:
            with packer.active():
                inside.set()
                release.wait(10)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    t = threading.Thread(target=hold)
    t.start()
    assert inside.wait(10)
    with torch.no_grad(), _autocast(), packer.active():
        model(x)
    assert "forward" in model[0].__dict__  # the other context is still open
    release.set()
    t.join(10)
    assert not errors and "forward" not in model[0].__dict__


def test_bf16_engine_decodes_through_the_packs(model, tokenizer, renderer, monkeypatch):
    calls = []
    real = packed_mod._packed_forward
    monkeypatch.setattr(packed_mod, "_packed_forward", lambda *a: calls.append(1) or real(*a))
    engine = TorchEngine(
        model, eos_ids=[tokenizer.eos_token_id], pad_id=tokenizer.pad_token_id, compute_dtype=torch.bfloat16
    )
    assert engine.packed is not None
    prompt = renderer.prompt_ids([{"role": "user", "content": "What is 12 * 34?"}])
    gens = engine.generate(
        [prompt], SamplingParams(), max_new_tokens=5, generator=torch.Generator().manual_seed(0)
    )
    assert calls and len(gens[0].token_ids) == 5
    assert TorchEngine(model, eos_ids=[tokenizer.eos_token_id], pad_id=tokenizer.pad_token_id).packed is None


fp32_packing = pytest.mark.skipif(
    not packing_available(torch.float32), reason="no oneDNN packed fp32 linear in this PyTorch build"
)


def _engine(model, tokenizer, **kw) -> TorchEngine:
    return TorchEngine(model, eos_ids=[tokenizer.eos_token_id], pad_id=tokenizer.pad_token_id, **kw)


@fp32_packing
def test_fp32_packs_give_linear_numbers_and_follow_updates():
    model, x = _mlp(), torch.randn(300, 32)  # more rows than the bf16 limit: fp32 packs take any pass
    packer = PackedLinears(model, torch.float32)
    assert packer.max_rows is None
    with torch.no_grad():
        ref = model(x)
        with packer.active():
            out = model(x)
            assert "forward" in model[0].__dict__
        torch.testing.assert_close(out, ref)  # fp32 defaults: float rounding, not bf16's
        model[2].weight.mul_(0.5)
        with packer.active():
            after = model(x)
        torch.testing.assert_close(after, model(x))
    with pytest.raises(ValueError, match="float32 or bfloat16"):
        PackedLinears(model, torch.float16)


@fp32_packing
def test_fp32_packed_engine_keeps_greedy_ids_and_the_trainers_logprobs(
    model, tokenizer, renderer, monkeypatch
):
    """The packed fp32 engine's greedy responses are the unpacked engine's, token for token, and the log-probs it
    samples with equal the trainer's recomputation as tightly as the unpacked engine's do (its `same_numerics`)."""
    prompts = [
        renderer.prompt_ids([{"role": "user", "content": q}])
        for q in (
            "What is 12 * 34?",
            "What is 1 + 2 + 3?",
            "A shop has 964 boxes with 59 pens each. How many?",
        )
    ]
    packed, plain = _engine(model, tokenizer, pack="on"), _engine(model, tokenizer, pack="off")
    assert packed.packed is not None and packed.packed.dtype == torch.float32 and plain.packed is None
    assert packed.capabilities.exact_logprobs
    greedy = SamplingParams(temperature=0.0)
    assert [g.token_ids for g in packed.generate(prompts, greedy, max_new_tokens=24)] == [
        g.token_ids for g in plain.generate(prompts, greedy, max_new_tokens=24)
    ]
    calls = []
    real = packed_mod._packed_forward
    monkeypatch.setattr(packed_mod, "_packed_forward", lambda *a: calls.append(1) or real(*a))
    gens = packed.generate(
        prompts, SamplingParams(), max_new_tokens=16, generator=torch.Generator().manual_seed(0)
    )
    assert calls
    ids = [p + g.token_ids for p, g in zip(prompts, gens)]
    masks = [[0] * len(p) + [1] * len(g.token_ids) for p, g in zip(prompts, gens)]
    batch = collate(ids, masks, pad_id=tokenizer.pad_token_id)
    with torch.no_grad():
        lp, _ = token_logprobs(model, batch.input_ids, batch.attention_mask)
    for b, (p, g) in enumerate(zip(prompts, gens)):
        torch.testing.assert_close(
            lp[b, len(p) : len(p) + len(g.token_ids)], torch.tensor(g.logprobs), atol=1e-4, rtol=0
        )


def test_pack_auto_packs_fp32_from_512_wide_where_mkl_is_slow_and_never_a_compiled_engine(
    model, tokenizer, monkeypatch
):
    wide = build_model(
        tokenizer,
        TinyModelConfig(hidden_size=512, intermediate_size=64, num_layers=1, num_heads=8, num_kv_heads=8),
    )
    monkeypatch.setattr(packed_mod, "cpu_vendor", lambda: "GenuineIntel")
    assert _engine(wide, tokenizer).packed is None  # MKL at the CPU's own width: unmeasured, left to MKL
    assert (_engine(wide, tokenizer, pack="on").packed is not None) == packing_available(torch.float32)
    monkeypatch.setattr(packed_mod, "cpu_vendor", lambda: "AuthenticAMD")
    expect = packing_available(torch.float32) and torch.backends.mkl.is_available()
    assert (_engine(wide, tokenizer).packed is not None) == expect  # auto, fp32, 512 wide, MKL on AMD
    assert _engine(model, tokenizer).packed is None  # auto, fp32, 64 wide: per-operation overhead, no gain
    assert _engine(wide, tokenizer, pack="off").packed is None
    assert _engine(wide, tokenizer, compile=True).packed is None
    assert _engine(model, tokenizer, compute_dtype=torch.bfloat16, compile=True).packed is None
    with pytest.raises(ValueError, match="Inductor cannot compile"):
        _engine(model, tokenizer, pack="on", compile=True)
    with pytest.raises(ValueError, match="rollout.torch.pack='yes'"):
        _engine(model, tokenizer, pack="yes")
    with pytest.raises(ValueError, match="rollout.torch.pack must be one of"):
        TorchEngineConfig(pack="always")
