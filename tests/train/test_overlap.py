"""`rl.off_policy_steps`: 0 is the synchronous loop to the bit, 1 samples one step ahead; both resume exactly.

The engine is the in-process torch engine on a copy of the policy that `sync_weights` overwrites (`CopyEngine`):
like a vLLM server it holds its own weights, so sampling ahead during the update is possible, and it is fast and
deterministic, so whole runs can be compared number for number.
"""

from __future__ import annotations

import copy

import pytest
import torch

from conftest import make_agent, make_model, rl_trainer
from tirl.rollout.capabilities import EngineCapabilities
from tirl.rollout.config import RolloutConfig
from tirl.rollout.engines.torch.engine import TorchEngine
from tirl.rollout.factory import capabilities_for
from tirl.rollout.sampling import SamplingParams
from tirl.train import checkpoint, checkpoint_read
from tirl.train.optim import OptimConfig
from tirl.train.rl.check import check_engine, check_rl
from tirl.train.rl.overlap import Lookahead, check_off_policy, staleness
from tirl.train.rl.trainer import RLConfig, RLTrainer

KEYS = (
    "reward/mean",
    "loss/total",
    "loss/grad_norm",
    "rollout/logprob_diff_max",
    "rollout/sampled_tokens",
    "rollout_corr/weight_mean",
)


class CopyEngine(TorchEngine):
    """The torch engine sampling from its own copy of the policy, which a sync overwrites (a server's shape)."""

    capabilities = EngineCapabilities(
        name="copy", weight_sync="memory", logprobs="full", per_request_seeds=False, multi_process=False,
        batches_requests=False,
    )  # fmt: skip

    def sync_weights(self, model: torch.nn.Module) -> None:
        with torch.no_grad():
            for dst, src in zip(self.model.parameters(), model.parameters(), strict=True):
                dst.copy_(src)
        self.weight_version += 1


def _trainer(tokenizer, renderer, sandbox, out, *, off: int, steps: int = 3) -> RLTrainer:
    torch.manual_seed(0)
    model = make_model(tokenizer)
    agent = make_agent(copy.deepcopy(model), renderer, sandbox, max_tokens=12)
    agent.engine = CopyEngine(agent.engine.model, eos_ids=[renderer.eos_id], pad_id=renderer.pad_id)
    rows = [
        {
            "prompt": [{"role": "user", "content": f"What is {a} * 3?"}],
            "reward_model": {"ground_truth": str(3 * a)},
        }
        for a in range(2, 8)
    ]
    cfg = RLConfig(
        steps=steps, prompts_per_step=2, n=4, mini_batch_size=8, optim=OptimConfig(lr=5e-2), save_every=1,
        entropy_coef=0.05, off_policy_steps=off,  # all rewards are -1 here: the entropy term moves the policy
    )  # fmt: skip
    return rl_trainer(model, tokenizer, agent, rows, cfg, out)


def _pick(history: list[dict]) -> list[list[float]]:
    return [[m[k] for k in KEYS] for m in history]


# `off_policy_steps=0` metrics of this run: the synchronous loop's, recorded once (inverse-CDF sampling, the
# engine/trainer correction computed in the update's own pass); the numbers are this machine's, as the demo's are
SYNCHRONOUS = [
    [-1.0, -0.29554471373558044, 0.002512397011741996, 9.5367431640625e-07, 12.0, 1.0],
    [-1.0, -0.28747275471687317, 0.019120698794722557, 4.76837158203125e-07, 12.0, 1.0],
    [-1.0, -0.2692807614803314, 0.026486912742257118, 9.5367431640625e-07, 12.0, 1.0],
]


def test_zero_is_the_synchronous_loop(tokenizer, renderer, sandbox, tmp_path):
    """The values the synchronous loop gave; float32 tolerance, since another transformers release may round the
    last bit differently (5.24 moves two of them by one ulp)."""
    history = _trainer(tokenizer, renderer, sandbox, tmp_path, off=0).train()
    assert "rollout/staleness" not in history[0]
    torch.testing.assert_close(torch.tensor(_pick(history)), torch.tensor(SYNCHRONOUS), rtol=1e-6, atol=1e-6)


def test_one_samples_a_step_ahead_and_logs_staleness(tokenizer, renderer, sandbox, tmp_path):
    a = _trainer(tokenizer, renderer, sandbox, tmp_path / "a", off=1).train()
    assert [m["rollout/staleness"] for m in a] == [0.0, 1.0, 1.0]
    # the first batch is sampled before any update, as synchronously; the update's mini-batch order differs (the
    # next batch's seed is drawn first), so its sums are reordered: float32 rounding
    torch.testing.assert_close(torch.tensor(_pick(a)[0]), torch.tensor(SYNCHRONOUS[0]))
    assert a[1]["rollout/logprob_diff_max"] > 1e-3  # step 1 trains on step 0's policy's samples: stale
    b = _trainer(tokenizer, renderer, sandbox, tmp_path / "b", off=1).train()
    assert _pick(a) == _pick(b)  # the background sampling is deterministic


@pytest.mark.parametrize("off", [0, 1])
def test_killed_and_resumed_matches_an_uninterrupted_run(tokenizer, renderer, sandbox, tmp_path, off):
    """Resumed from checkpoint-1 (with off=1 it holds the batch sampled during step 1's update)."""
    full = _trainer(tokenizer, renderer, sandbox, tmp_path / "full", off=off).train()
    resumed = _trainer(tokenizer, renderer, sandbox, tmp_path / "resumed", off=off)
    if off:
        assert checkpoint_read.load_state(tmp_path / "full" / "checkpoint-1")["pending"] is not None
    checkpoint.restore_trainer(resumed, tmp_path / "full" / "checkpoint-1")
    assert resumed.run.agent.engine.weight_version == 1  # the checkpoint's weights were sent to the engine
    rest = resumed.train()
    assert _pick(rest) == _pick(full[1:])


def test_the_in_process_engine_and_dynamic_sampling_are_refused():
    cfg = RLConfig(steps=1, prompts_per_step=1, n=2, mini_batch_size=2, off_policy_steps=1)
    with pytest.raises(
        ValueError, match="off_policy_steps=1 with rollout.engine=torch: it samples from the module"
    ):
        check_rl(cfg, RolloutConfig(engine="torch"), world=1)
    check_engine(cfg, capabilities_for("vllm"), SamplingParams(), world=1)  # a server engine samples ahead
    with pytest.raises(ValueError, match="off_policy_steps=2; valid: 0"):
        check_off_policy(2, dynamic_sampling=False)
    with pytest.raises(ValueError, match="with rl.dynamic_sampling"):
        RLConfig(off_policy_steps=1, dynamic_sampling=True)


def test_lookahead_hands_each_batch_over_once_and_re_raises():
    ahead = Lookahead()
    ahead.start(lambda: "batch")
    with pytest.raises(RuntimeError, match="already sampled ahead"):
        ahead.start(lambda: "again")
    assert ahead.take() == "batch" and ahead.take() is None
    ahead.start(lambda: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        ahead.wait()
    ahead.close()
    assert staleness([], 3) == 0.0
