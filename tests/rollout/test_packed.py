"""bf16 decode over packed weights (`tirl.rollout.packed`): autocast's numbers to bf16 rounding, packs that follow
in-place weight updates, and the module's own forward wherever the packed path does not apply."""

import threading

import pytest
import torch

from tirl.rollout import packed as packed_mod
from tirl.rollout.engine import TorchEngine
from tirl.rollout.packed import MAX_ROWS, PackedLinears, packing_available
from tirl.rollout.sampling import SamplingParams

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
