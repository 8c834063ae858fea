"""An optimizer step reaches every later bf16 forward: PyTorch's fused AdamW writes the weights in place without
bumping their version counters, and the LM head's bf16 copy (`tirl.train.head`) is cached by version, so without
`clip_and_step`'s bump every autocast pass after the first step ran the head on the weights it started with (an RL
run's engine/trainer log-prob gap grew from 2e-3 to 2.6 after one update at lr 5e-2)."""

import copy

import torch

from conftest import make_model
from tirl.train.logprobs import token_logprobs
from tirl.train.optim import OptimConfig, build_optimizer, clip_and_step


def test_bf16_logprobs_after_a_fused_step_use_the_new_weights(tokenizer):
    torch.manual_seed(0)
    model = make_model(tokenizer).train()
    opt, sched = build_optimizer(model, OptimConfig(lr=5e-2, weight_decay=0.0), 10)
    assert opt.defaults.get("fused")  # the path that skipped the version bump
    ids = torch.randint(0, tokenizer.vocab_size, (2, 12), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)

    def logp(m: torch.nn.Module) -> torch.Tensor:
        return token_logprobs(m, ids, mask, autocast=torch.bfloat16)[0]

    before = logp(model)
    (-before.sum()).backward()
    _, stepped = clip_and_step(model, opt, sched, OptimConfig(lr=5e-2, weight_decay=0.0))
    assert stepped
    with torch.no_grad():
        after = logp(model)
        fresh = logp(copy.deepcopy(model))  # other tensors: no cached copy to reuse
    assert (after - before).abs().max() > 0.1  # the step moved the log-probs
    assert torch.equal(after, fresh)
