"""One RL step on scripted trajectories: the on-policy shortcut equals recomputing old log-probs."""

import copy

import pytest
import torch

from conftest import make_agent, make_model, rl_trainer
from tirl.rewards.shaping import RewardConfig
from tirl.rollout.sampling import SamplingParams
from tirl.train.optim import OptimConfig
from tirl.train.rl.run import assemble
from tirl.train.rl.trainer import RLConfig, RLTrainer, trajectory_batch


def _trainer(model, tokenizer, renderer, sandbox, tmp_path, mini_batch):
    agent = make_agent(model, renderer, sandbox, max_tokens=12)
    rows = [
        {"prompt": [{"role": "user", "content": "What is 2 * 3?"}], "reward_model": {"ground_truth": "6"}}
    ]
    cfg = RLConfig(steps=1, prompts_per_step=2, n=4, mini_batch_size=mini_batch, optim=OptimConfig(lr=1e-3))
    return rl_trainer(model, tokenizer, agent, rows, cfg, tmp_path)


def test_on_policy_update_equals_recomputed_old_logprobs(tokenizer, renderer, sandbox, tmp_path):
    torch.manual_seed(0)
    a = make_model(tokenizer)
    b = copy.deepcopy(a)
    ta = _trainer(a, tokenizer, renderer, sandbox, tmp_path / "a", mini_batch=8)
    tb = _trainer(b, tokenizer, renderer, sandbox, tmp_path / "b", mini_batch=8)
    trajs = ta.run.agent.run(
        [[{"role": "user", "content": "What is 2 * 3?"}]] * 8,
        SamplingParams(),
        generator=torch.Generator().manual_seed(1),
    )
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 1.0, -1.0, 0.0, 0.0])
    batch = trajectory_batch(trajs, adv, pad_id=tokenizer.pad_token_id)
    ta.gen.manual_seed(0)
    tb.gen.manual_seed(0)
    stats_a = ta._update(batch, None, None)  # on-policy shortcut
    stats_b = tb._update(batch, tb._logprobs(b, batch), None)  # explicit recomputation
    for pa, pb in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(pa, pb)
    assert abs(stats_a["loss/pg"] - stats_b["loss/pg"]) < 1e-6
    assert stats_a["loss/clipfrac"] == 0.0  # ratio is exactly 1 on the only update
    assert any((pa != pc).any() for pa, pc in zip(a.parameters(), make_model(tokenizer).parameters()))


def _scripted_batch(trainer, tokenizer, n=8, seed=1):
    trajs = trainer.run.agent.run(
        [[{"role": "user", "content": "What is 2 * 3?"}]] * n,
        SamplingParams(),
        generator=torch.Generator().manual_seed(seed),
    )
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 1.0, -1.0, 0.25, -0.25])[:n]
    return trajs, adv


def test_seq_mean_token_sum_norm_ignores_batch_padding(tokenizer, renderer, sandbox, tmp_path):
    """The Dr. GRPO constant is the response budget, not the padded width: a longer sequence in the batch (here
    one with no trained token, so it adds nothing else) must not change the loss or the update."""
    torch.manual_seed(0)
    a = make_model(tokenizer)
    b = copy.deepcopy(a)
    ta = _trainer(a, tokenizer, renderer, sandbox, tmp_path / "a", mini_batch=16)
    tb = _trainer(b, tokenizer, renderer, sandbox, tmp_path / "b", mini_batch=16)
    for t in (ta, tb):
        t.run.cfg.loss.agg = t.loss_spec.agg = "seq-mean-token-sum-norm"
    assert ta.loss_spec.norm_len == 12  # the agent's response budget
    trajs, adv = _scripted_batch(ta, tokenizer)
    batch = trajectory_batch(trajs, adv, pad_id=tokenizer.pad_token_id)
    B, T = batch.input_ids.shape
    wide = copy.deepcopy(batch)
    pad = lambda x, v: torch.cat([x, torch.full((x.shape[0], 9), v, dtype=x.dtype)], dim=1)  # noqa: E731
    wide.input_ids = torch.cat(
        [pad(batch.input_ids, tokenizer.pad_token_id), torch.randint(3, 50, (1, T + 9))]
    )
    wide.attention_mask = torch.cat([pad(batch.attention_mask, 0), torch.ones(1, T + 9, dtype=torch.long)])
    wide.loss_mask = torch.cat([pad(batch.loss_mask, 0), torch.zeros(1, T + 9)])
    wide.extra["advantages"] = torch.cat([pad(batch.extra["advantages"], 0), torch.zeros(1, T + 9)])
    wide.prefix_len = torch.cat([batch.prefix_len, torch.tensor([T + 9])])  # all prompt, nothing trained
    sa = ta._update(batch, None, None)
    sb = tb._update(wide, None, None)
    assert abs(sa["loss/pg"] - sb["loss/pg"]) < 1e-6
    for pa, pb in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(pa, pb)


def test_non_finite_update_is_skipped_in_rl(tokenizer, renderer, sandbox, tmp_path):
    from tirl.train.optim import NonFiniteError

    torch.manual_seed(0)
    model = make_model(tokenizer)
    t = _trainer(model, tokenizer, renderer, sandbox, tmp_path, mini_batch=8)
    before = [p.detach().clone() for p in model.parameters()]
    trajs, adv = _scripted_batch(t, tokenizer)
    adv[0] = float("nan")  # e.g. a reward that came back NaN
    batch = trajectory_batch(trajs, adv, pad_id=tokenizer.pad_token_id)
    stats = t._update(batch, None, None)
    assert stats["loss/skipped_updates"] == 1.0
    for p, q in zip(before, model.parameters()):
        assert torch.equal(p, q)
    assert not t.opt.state  # AdamW never stepped: no moments were created
    t.skips.limit = 2
    with pytest.raises(NonFiniteError, match="2 updates in a row"):
        t._update(batch, None, None)
    for p, q in zip(before, model.parameters()):
        assert torch.equal(p, q)


def test_prompts_over_max_prompt_tokens_are_dropped_at_start(model, tokenizer, renderer, sandbox, tmp_path):
    """verl's filter_overlong_prompts: a prompt longer than agent.max_prompt_tokens never reaches a rollout."""
    short = {"prompt": [{"role": "user", "content": "2 * 3?"}], "reward_model": {"ground_truth": "6"}}
    long = {
        "prompt": [{"role": "user", "content": "What is 2 * 3? " * 40}],
        "reward_model": {"ground_truth": "6"},
    }
    limit = len(renderer.prompt_ids(short["prompt"])) + 5
    assert len(renderer.prompt_ids(long["prompt"])) > limit
    agent = make_agent(model, renderer, sandbox, max_tokens=8)
    agent.config.max_prompt_tokens = limit
    kw = dict(sampling=SamplingParams(), reward=RewardConfig(), out_dir=tmp_path, seed=0)
    cfg = RLConfig(steps=1, prompts_per_step=1, n=2, mini_batch_size=2)
    trainer = RLTrainer(assemble(model, tokenizer, agent, [long, short, long], cfg, **kw))
    assert [r.prompt for r in trainer.run.rows] == [short["prompt"]]
    with pytest.raises(ValueError, match="every RL prompt is longer than agent.max_prompt_tokens"):
        RLTrainer(assemble(model, tokenizer, agent, [long], cfg, **kw))


def test_the_trainers_keep_their_run_record_and_copy_none_of_its_fields(
    tokenizer, renderer, sandbox, tmp_path
):
    from dataclasses import fields

    from tirl.train.rl.run import RLRun
    from tirl.train.sft import SFTConfig, SFTRun, SFTTrainer, sft_run

    rl = _trainer(make_model(tokenizer), tokenizer, renderer, sandbox, tmp_path / "rl", mini_batch=8)
    assert isinstance(rl.run, RLRun) and rl.model is rl.run.policy and rl.identity is rl.run.identity
    assert not set(vars(rl)) & {f.name for f in fields(RLRun)} - {"run"}
    rows = [{"messages": [{"role": "user", "content": "Say 1."}, {"role": "assistant", "content": "1"}]}]
    sft = SFTTrainer(sft_run(make_model(tokenizer), renderer, rows, SFTConfig(epochs=1), pad_id=0, seed=0))
    assert isinstance(sft.run, SFTRun) and sft.model is sft.run.model
    assert not set(vars(sft)) & {f.name for f in fields(SFTRun)}
