"""Mismatch metrics and the rollout correction inside an RL step, with a server-like engine whose log-probs are
off by a planted constant; the top-p/top-k rule for RL."""

import math

import pytest
import torch

from conftest import make_agent, make_model
from tirl.rewards.shaping import RewardConfig
from tirl.rollout.capabilities import EngineCapabilities, capabilities_of
from tirl.rollout.engines.base import RemoteModel
from tirl.rollout.engines.torch.engine import TorchEngine
from tirl.rollout.sampling import SamplingParams
from tirl.rollout.types import Generation
from tirl.train.optim import OptimConfig
from tirl.train.rl.check import check_engine
from tirl.train.rl.config import CorrectionConfig
from tirl.train.rl.run import assemble
from tirl.train.rl.trainer import RLConfig, RLTrainer

SHIFT = 0.3  # the engine reports log pi_rollout = log pi_trainer - 0.3 on every sampled token


class ShiftedEngine(RemoteModel):
    """Not the in-process engine (as a vLLM or HTTP engine would be): samples with it, reports shifted log-probs."""

    capabilities = EngineCapabilities(
        name="shifted", weight_sync="memory", logprobs="renormalized", per_request_seeds=False, multi_process=False,
        batches_requests=False,
    )  # fmt: skip

    def __init__(self, inner):
        self.inner = inner

    @property
    def weight_version(self):
        return self.inner.weight_version

    def generate(self, prompts, params, *, max_new_tokens=None, generator=None, seeds=None):
        gens = self.inner.generate(prompts, params, max_new_tokens=max_new_tokens, generator=generator)
        return [Generation(g.token_ids, [x - SHIFT for x in g.logprobs], g.finish_reason) for g in gens]

    def sync_weights(self, model):
        self.inner.sync_weights(model)

    def close(self):
        pass


def _trainer(tokenizer, renderer, sandbox, tmp_path, *, shifted, sampling=None, autocast=None, **rl):
    model = make_model(tokenizer)
    agent = make_agent(model, renderer, sandbox, max_tokens=12)
    if autocast == "engine":
        agent.engine = TorchEngine(
            model, eos_ids=[renderer.eos_id], pad_id=renderer.pad_id, compute_dtype=torch.bfloat16
        )
    if shifted:
        agent.engine = ShiftedEngine(agent.engine)
    rows = [
        {"prompt": [{"role": "user", "content": "What is 2 * 3?"}], "reward_model": {"ground_truth": "6"}}
    ]
    cfg = RLConfig(steps=1, prompts_per_step=2, n=4, mini_batch_size=8, optim=OptimConfig(lr=1e-3), **rl)
    check_engine(
        cfg, capabilities_of(agent.engine), sampling or SamplingParams(), world=1
    )  # the stage's check
    return RLTrainer(assemble(
        model, tokenizer, agent, rows, cfg, sampling=sampling or SamplingParams(), reward=RewardConfig(),
        out_dir=tmp_path, seed=0, autocast=autocast if isinstance(autocast, torch.dtype) else None,
    ))  # fmt: skip


def test_server_engine_step_logs_mismatch_and_applies_token_tis(tokenizer, renderer, sandbox, tmp_path):
    torch.manual_seed(0)
    t = _trainer(tokenizer, renderer, sandbox, tmp_path, shifted=True)
    assert t.correction == "token_tis"  # the default (auto) for an engine other than the in-process one
    m = t.step()
    # recomputation in a different batch shape: float32 round-off only
    assert m["rollout/logprob_diff_mean"] == pytest.approx(SHIFT, abs=1e-4)
    assert m["rollout/logprob_diff_max"] == pytest.approx(SHIFT, abs=1e-4)
    assert m["rollout/kl_k3"] == pytest.approx(math.exp(SHIFT) - SHIFT - 1, abs=1e-4)
    assert m["rollout_corr/weight_mean"] == pytest.approx(math.exp(SHIFT), abs=1e-3)  # below the cap 2
    assert m["rollout_corr/capped_frac"] == 0.0


@pytest.mark.parametrize("correction", ["token_tis", "seq_mis"])
def test_on_policy_correction_in_the_update_pass_equals_the_recomputed_one(
    tokenizer, renderer, sandbox, tmp_path, correction
):
    """One update per step: the correction computed inside the update's own forward pass (no separate no-grad pass)
    moves the weights as the recomputed old log-probs do, to float rounding, and reports the same metrics."""
    out = []
    for mode in ("auto", "recompute"):
        torch.manual_seed(0)
        t = _trainer(
            tokenizer, renderer, sandbox, tmp_path / mode, shifted=True, old_logprobs=mode,
            correction=CorrectionConfig(correction, mis_high=1e9),  # seq_mis keeps every sequence
        )  # fmt: skip
        t.adv_fn = lambda rewards, groups: torch.linspace(-1, 1, len(rewards))  # a signal to learn from
        start = [p.detach().clone() for p in t.run.policy.parameters()]
        calls = []
        t._logprobs = lambda model, batch, f=t._logprobs, calls=calls: calls.append(1) or f(model, batch)
        m = t.step()
        assert len(calls) == (mode == "recompute")
        moved = [p.detach().clone() for p in t.run.policy.parameters()]
        out.append((m, start, moved))
    (m_pass, start, w_pass), (m_re, _, w_re) = out
    step = max((a - b).abs().max().item() for a, b in zip(start, w_re, strict=True))
    gap = max((a - b).abs().max().item() for a, b in zip(w_pass, w_re, strict=True))
    assert step > 1e-3 and gap < 0.02 * step
    for k in m_re:
        if k.startswith(("rollout/logprob_diff", "rollout/kl", "rollout_corr/")):
            assert m_pass[k] == pytest.approx(m_re[k], abs=1e-4), k


def test_seq_mis_masks_long_shifted_sequences(tokenizer, renderer, sandbox, tmp_path):
    torch.manual_seed(0)
    t = _trainer(
        tokenizer,
        renderer,
        sandbox,
        tmp_path,
        shifted=True,
        correction=CorrectionConfig("seq_mis", mis_high=1.5),
    )
    m = t.step()
    # a sequence of n sampled tokens has rho = exp(0.3 n): kept only when n = 1 (1.35 <= 1.5)
    n = [sum(x.loss_mask) for x in t.last_trajectories]
    assert m["rollout_corr/masked_seq_frac"] == pytest.approx(sum(k > 1 for k in n) / len(n))


def test_torch_engine_default_is_off_and_unchanged(tokenizer, renderer, sandbox, tmp_path):
    torch.manual_seed(0)
    t = _trainer(tokenizer, renderer, sandbox, tmp_path, shifted=False)
    assert t.correction == "none"
    m = t.step()
    assert not any(
        k.startswith(("rollout/logprob_diff", "rollout_corr/")) for k in m
    )  # on-policy: no recompute
    t2 = _trainer(
        tokenizer, renderer, sandbox, tmp_path / "b", shifted=False, ppo_epochs=2, old_logprobs="recompute"
    )
    m2 = t2.step()
    assert m2["rollout/logprob_diff_max"] < 1e-4  # same module: only round-off between batch shapes


def test_engine_logprobs_serve_as_old_logprobs(tokenizer, renderer, sandbox, tmp_path):
    """Two updates per step with the torch engine: its sampling log-probs are the old ones (no no-grad pass), and
    the step moves the weights as the recomputed ones would, to float rounding."""
    weights = []
    for mode in ("auto", "recompute"):
        torch.manual_seed(0)
        t = _trainer(
            tokenizer, renderer, sandbox, tmp_path / mode, shifted=False, ppo_epochs=2, old_logprobs=mode
        )
        t.adv_fn = lambda rewards, groups: torch.linspace(-1, 1, len(rewards))  # a signal to learn from
        start = [p.detach().clone() for p in t.run.policy.parameters()]
        calls = []
        t._logprobs = lambda model, batch, f=t._logprobs, calls=calls: calls.append(1) or f(model, batch)
        m = t.step()
        assert len(calls) == (mode == "recompute") and ("rollout/logprob_diff_max" in m) == (
            mode == "recompute"
        )
        weights.append([p.detach().clone() for p in t.run.policy.parameters()])
        step = max((a - b).abs().max().item() for a, b in zip(start, weights[-1], strict=True))
    gap = max((a - b).abs().max().item() for a, b in zip(*weights, strict=True))
    assert step > 1e-3 and gap < 0.02 * step  # AdamW's first steps magnify float rounding in small gradients


@pytest.mark.parametrize("autocast", ["engine", torch.bfloat16])
def test_bf16_on_either_side_recomputes_and_corrects(tokenizer, renderer, sandbox, tmp_path, autocast):
    """A bf16 decode (`rollout.dtype: bfloat16`) or a bf16 trainer (`model.autocast`) gives other log-probs than
    the engine reported, though both run one module: the step recomputes them, measures the gap and corrects."""
    torch.manual_seed(0)
    t = _trainer(tokenizer, renderer, sandbox, tmp_path, shifted=False, autocast=autocast)
    assert t.correction == "token_tis"
    m = t.step()
    assert 0 < m["rollout/logprob_diff_max"] < 0.5 and "rollout_corr/weight_mean" in m


def test_truncated_sampling_refused_for_renormalizing_engines(tokenizer, renderer, sandbox, tmp_path):
    with pytest.raises(ValueError, match="renormalized"):
        _trainer(tokenizer, renderer, sandbox, tmp_path, shifted=True, sampling=SamplingParams(top_p=0.9))
    with pytest.raises(ValueError, match="renormalized"):
        _trainer(tokenizer, renderer, sandbox, tmp_path, shifted=True, sampling=SamplingParams(top_k=5))
    # the torch engine reports full-vocabulary log-probs (before truncation): allowed
    _trainer(tokenizer, renderer, sandbox, tmp_path, shifted=False, sampling=SamplingParams(top_p=0.9))


def test_bad_correction_config():
    with pytest.raises(ValueError, match="rl.correction.mode"):
        CorrectionConfig("tis")
    with pytest.raises(ValueError, match="mis_low"):
        CorrectionConfig(mis_low=2.0, mis_high=1.0)
