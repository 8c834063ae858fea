"""`model.compile_layers` (`tirl.train.compiled`): the update's decoder layers through `torch.compile`, lengths
padded to `model.compile_pad_multiple`. On the CPU: the log-probs (and gradients) of the real positions are the
eager pass's within 1e-5, the padded lengths bound the shapes compiled, the model's own layers are back after
each pass. Fast tests compile with the `aot_eager` backend (no code generation); the Inductor one is slow."""

from __future__ import annotations

import copy

import pytest
import torch

from conftest import make_agent, make_model, rl_trainer
from tirl.commands.run_config import TirlConfig
from tirl.core.config import ConfigError, load_config
from tirl.rollout.sampling import SamplingParams
from tirl.train.compiled import CompiledLayers, decoder_layers
from tirl.train.logprobs import token_logprobs
from tirl.train.optim import OptimConfig
from tirl.train.rl.trainer import RLConfig, trajectory_batch

FAST = {"backend": "aot_eager"}


def _batch(vocab: int, lengths: list[int], seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ids, attention and a loss mask on each row's second half."""
    g = torch.Generator().manual_seed(seed)
    T = max(lengths)
    ids = torch.randint(3, vocab, (len(lengths), T), generator=g)
    attn = torch.zeros(len(lengths), T, dtype=torch.long)
    loss = torch.zeros_like(attn)
    for i, n in enumerate(lengths):
        attn[i, :n] = 1
        loss[i, n // 2 : n] = 1
    return ids * attn, attn, loss


def _logprobs(model, batch, compiled=None):
    ids, attn, loss = batch
    return token_logprobs(model, ids, attn, loss_mask=loss, with_entropy=True, compiled=compiled)


def test_compiled_layers_give_the_eager_logprobs_and_gradients(model):
    torch._dynamo.reset()
    batch = _batch(model.config.vocab_size, [13, 9, 5])
    model.train()
    eager, eager_ent = _logprobs(model, batch)
    eager.sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    compiled = CompiledLayers(model, 8, FAST)
    own = list(decoder_layers(model))
    logp, ent = _logprobs(model, batch, compiled)
    assert logp.shape == eager.shape
    torch.testing.assert_close(logp, eager, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent, eager_ent, atol=1e-5, rtol=0)
    assert (logp[batch[2] == 0] == 0).all()  # padding and untrained positions stay 0
    logp.sum().backward()
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, grads[n], atol=1e-5, rtol=1e-4, msg=n)
    assert list(decoder_layers(model)) == own  # the model's own layers back after the pass
    assert not any(k.startswith("_orig_mod") or "._orig_mod." in k for k in model.state_dict())
    assert compiled.shapes == {(3, 16): 1}


def test_padding_to_the_multiple_bounds_the_shapes_compiled(model):
    """Micro-batches of 2 rows with longest lengths 5..24: 20 lengths, 3 padded shapes (multiple 8), one compile
    of each layer per shape."""
    torch._dynamo.reset()
    compiles = []

    def backend(gm, example_inputs):
        compiles.append(gm)
        return gm.forward

    compiled = CompiledLayers(model, 8, {"backend": backend})
    with torch.no_grad():
        for T in range(5, 25):
            batch = _batch(model.config.vocab_size, [T, max(2, T - 3)], seed=T)
            want, _ = _logprobs(model, batch)
            got, _ = _logprobs(model, batch, compiled)
            torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    assert set(compiled.shapes) == {(2, 8), (2, 16), (2, 24)}
    # the layers share one code object: a graph per padded shape (the first layer's compile serves the other,
    # whose guards differ only in the module), never one per length
    assert len(compiled.shapes) <= len(compiles) <= len(compiled.shapes) * len(compiled.compiled), len(
        compiles
    )


def test_the_options_are_checked_and_off_by_default(model):
    cfg = load_config(TirlConfig, None, [])
    assert not cfg.model.compile_layers and cfg.model.compile_pad_multiple == 64
    with pytest.raises(ConfigError, match=r"model\.compile_pad_multiple must be >= 1"):
        load_config(TirlConfig, None, ["model.compile_pad_multiple=0"])
    with pytest.raises(ValueError, match=r"has no decoder with a list of layers"):
        CompiledLayers(torch.nn.Linear(2, 2), 8)


def test_an_rl_update_through_compiled_layers_is_the_eager_update(tokenizer, renderer, sandbox, tmp_path):
    """The RL stage's path: `compile_pad_multiple` in the run gives the trainer's loss its compiled layers; one
    update through them moves the weights as the eager update does (to float rounding)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    eager_model = make_model(tokenizer)
    models = (eager_model, copy.deepcopy(eager_model))
    rows = [
        {"prompt": [{"role": "user", "content": "What is 2 * 3?"}], "reward_model": {"ground_truth": "6"}}
    ]
    trainers = []
    for i, (m, multiple) in enumerate(zip(models, (0, 16), strict=True)):
        cfg = RLConfig(steps=1, prompts_per_step=2, n=4, mini_batch_size=8, optim=OptimConfig(lr=1e-3))
        agent = make_agent(m, renderer, sandbox, max_tokens=12)
        trainers.append(
            rl_trainer(m, tokenizer, agent, rows, cfg, tmp_path / str(i), compile_pad_multiple=multiple)
        )
    eager, compiled = trainers
    assert eager.loss_spec.compiled is None and compiled.loss_spec.compiled.multiple == 16
    compiled.loss_spec.compiled = CompiledLayers(models[1], 16, FAST)  # the fast backend for the test
    trajs = eager.run.agent.run(
        [[{"role": "user", "content": "What is 2 * 3?"}]] * 8,
        SamplingParams(),
        generator=torch.Generator().manual_seed(1),
    )
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 1.0, -1.0, 0.0, 0.0])
    batch = trajectory_batch(trajs, adv, pad_id=tokenizer.pad_token_id)
    for t in trainers:
        t.gen.manual_seed(0)
    stats = [t._update(batch, None, None) for t in trainers]
    assert abs(stats[0]["loss/pg"] - stats[1]["loss/pg"]) < 1e-5
    for a, b in zip(*(m.parameters() for m in models), strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    assert compiled.loss_spec.compiled.shapes  # the update ran through the compiled layers
    assert all(T % 16 == 0 for _, T in compiled.loss_spec.compiled.shapes)


@pytest.mark.slow
def test_inductor_compiled_layers_give_the_eager_logprobs(model):
    torch._dynamo.reset()
    batch = _batch(model.config.vocab_size, [13, 9, 5])
    eager, _ = _logprobs(model, batch)
    logp, _ = _logprobs(model, batch, CompiledLayers(model, 8))
    torch.testing.assert_close(logp, eager, atol=1e-5, rtol=0)
