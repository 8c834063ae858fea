"""Every engine package declares itself completely: a spec the factory finds by name, a class with every member of
the `Engine` protocol (callers never fall back on `getattr`), and a memory model `tirl plan` asks."""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import pytest

from tirl.rollout.config import ENGINES, RolloutConfig
from tirl.rollout.engines.base import ENGINE_MEMBERS, Engine
from tirl.rollout.engines.spec import EngineMemory, MemoryQuery
from tirl.rollout.factory import capabilities_for, engine_class, engine_spec


def test_the_protocol_lists_every_member_it_declares():
    declared = {n for n in vars(Engine) if not n.startswith("_")} | set(Engine.__annotations__)
    assert declared == set(ENGINE_MEMBERS)


@pytest.mark.parametrize("name", ENGINES)
def test_each_engine_class_has_every_protocol_member(name):
    spec = engine_spec(name)
    assert spec.name == name
    cls = engine_class(name)
    missing = [m for m in ENGINE_MEMBERS if m not in ("weight_version",) and not hasattr(cls, m)]
    assert missing == [], f"{cls.__name__} lacks {missing}"
    for method in ("check", "generate", "sync_weights", "awake", "close"):
        assert callable(getattr(cls, method))
    assert "weight_version" in inspect.getsource(cls.__init__) or any(
        "weight_version" in inspect.getsource(base.__init__)
        for base in cls.__mro__[1:]
        if "__init__" in vars(base)
    )
    assert capabilities_for(name).name in (name, "vllm")


def test_an_unknown_engine_name_lists_the_valid_ones():
    with pytest.raises(ValueError, match="unknown rollout.engine 'sglang'; valid: openai, torch, vllm"):
        engine_spec("sglang")


@pytest.mark.parametrize("name", ENGINES)
def test_each_engine_answers_the_plans_memory_question(name):
    ro = RolloutConfig(engine=name, urls=["http://127.0.0.1:1"] if name == "openai" else [],
                       model_name="m" if name == "openai" else "")  # fmt: skip
    hf = SimpleNamespace(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2)
    q = MemoryQuery(ro, hf, params=1_000_000, model_dtype="float32", compute_bytes=4, sequence_tokens=100,
                    trajectories=16, world=1, gpu_gib=80.0, resident_gib=1.0)  # fmt: skip
    memory = engine_spec(name).memory(q)
    assert isinstance(memory, EngineMemory) and memory.where and memory.fits
    if (
        name == "torch"
    ):  # 16 rows x 100 positions x (2 layers x 2 heads x 16 x 2 x 4 B) + 1 GiB of kept prefixes
        assert memory.gib == pytest.approx(16 * 100 * 512 / 2**30 + 1.0)
    if name == "openai":
        assert memory.gib == 0.0


def test_the_torch_engine_answers_the_protocol_itself(tokenizer):
    from conftest import make_model
    from tirl.rollout.engines.torch.engine import TorchEngine

    model = make_model(tokenizer, max_positions=333)
    engine = TorchEngine(model, eos_ids=[1], pad_id=0)
    assert engine.max_positions == 333
    assert engine.device.type == "cpu"
    with engine.awake():
        pass
