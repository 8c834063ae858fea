"""`rollout.torch.compile_graph_step`: the static decode step of `tirl.rollout.engines.torch.graph_decode` through
`torch.compile`, run on the CPU without a capture: the same ids and log-probs as the uncompiled static step, one
compile per (bucket, capacity), and the config key's check. The fast tests compile with the `aot_eager` backend
(dynamo's trace and AOT autograd, no code generation: Inductor's C++ compile takes a minute on the test
machines); the Inductor one is marked slow."""

from __future__ import annotations

import pytest
import torch

from tirl.commands.run_config import TirlConfig
from tirl.core.config import ConfigError, load_config
from tirl.rollout.engines.torch.config import TorchEngineConfig
from tirl.rollout.engines.torch.engine import TorchEngine
from tirl.rollout.engines.torch.graph_decode import GraphDecoder
from tirl.rollout.sampling import SamplingParams

QUESTIONS = ("What is 12 * 34?", "hi", "What is 7 - 5?", "A shop has 964 boxes with 59 pens each. How many?")
LIMITS = [9, 4, 7, 6]  # rows finish at different steps: the steps run at smaller buckets


@pytest.fixture()
def sharp(model):
    """The random model with its matrices scaled up, so that its ids depend on the context."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(8.0)
    return model


def _decode(model, tokenizer, renderer, compile_options: dict | None, temperature: float):
    engine = TorchEngine(model, eos_ids=[tokenizer.eos_token_id], pad_id=tokenizer.pad_token_id, pack="off")
    engine.graphs = GraphDecoder(
        engine, capture=False, compile_step=compile_options is not None, compile_options=compile_options
    )
    prompts = [renderer.prompt_ids([{"role": "user", "content": q}]) for q in QUESTIONS]
    gens = engine.generate(
        prompts, SamplingParams(temperature=temperature), max_new_tokens=LIMITS,
        generator=torch.Generator().manual_seed(1),
    )  # fmt: skip
    return gens, engine.graphs


def _assert_same(plain, compiled) -> None:
    assert [g.token_ids for g in compiled] == [g.token_ids for g in plain]
    assert [g.finish_reason for g in compiled] == [g.finish_reason for g in plain]
    for p, c in zip(plain, compiled, strict=True):
        torch.testing.assert_close(torch.tensor(c.logprobs), torch.tensor(p.logprobs), atol=1e-5, rtol=0)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_compiled_static_step_gives_the_static_steps_ids_and_logprobs(
    sharp, tokenizer, renderer, temperature
):
    torch._dynamo.reset()
    plain, _ = _decode(sharp, tokenizer, renderer, None, temperature)
    compiled, graphs = _decode(sharp, tokenizer, renderer, {"backend": "aot_eager"}, temperature)
    _assert_same(plain, compiled)
    assert len(graphs.bucket_steps) >= 2, (
        graphs.bucket_steps
    )  # compacted to a smaller bucket: a second compile


def test_the_static_step_compiles_once_per_bucket(sharp, tokenizer, renderer):
    """Static shapes: one graph per (bucket, capacity), none again for a step at a shape seen before."""
    torch._dynamo.reset()
    compiles = []

    def backend(gm, example_inputs):
        compiles.append(gm)
        return gm.forward

    _, graphs = _decode(sharp, tokenizer, renderer, {"backend": backend}, 1.0)
    assert len(compiles) == len(graphs.bucket_steps) < sum(graphs.bucket_steps.values())
    _decode(sharp, tokenizer, renderer, {"backend": backend}, 1.0)  # a new decoder: its own compiled function
    assert len(compiles) <= 2 * len(graphs.bucket_steps)


def test_compile_graph_step_needs_cuda_graphs():
    assert TorchEngineConfig(cuda_graphs="auto", compile_graph_step=True).compile_graph_step
    with pytest.raises(
        ValueError, match=r"rollout\.torch\.compile_graph_step=true .*cuda_graphs, which is off"
    ):
        TorchEngineConfig(compile_graph_step=True)
    with pytest.raises(ConfigError, match=r"compile_graph_step"):
        load_config(TirlConfig, None, ["rollout.torch.compile_graph_step=true"])


@pytest.mark.slow
def test_the_inductor_compiled_static_step(sharp, tokenizer, renderer):
    torch._dynamo.reset()
    plain, _ = _decode(sharp, tokenizer, renderer, None, 1.0)
    compiled, _ = _decode(sharp, tokenizer, renderer, {}, 1.0)
    _assert_same(plain, compiled)
