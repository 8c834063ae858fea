"""Parity with verl 0.9.1's own functions (verl.trainer.ppo.core_algos) on the same inputs.

verl is installed from PyPI with --no-deps into a cache folder (`TIRL_VERL_SITE`, default
`.venv/verl-parity-0.9.1`), with the few packages its core_algos import chain needs, and run in a subprocess so
none of it enters the test process. Where it cannot be installed (no network, no pip), the tests skip and say so.

Deliberate differences, tested as such: a group of one gets advantage 0 in tirl (verl passes the raw reward
through, but tirl refuses rl.n = 1 at start-up), and an all-equal group gets exactly 0 (verl divides float32
rounding noise by ~1e-6).
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tirl.algorithms import (
    aggregate,
    entropy_from_logits,
    get_advantage_estimator,
    get_policy_loss,
    kl_penalty,
)

HERE = Path(__file__).parent
REPO = HERE.parent.parent
PACKAGES = [
    "verl==0.9.1",
    "omegaconf==2.4.0",
    "tensordict==0.15.3",
    "pyvers==0.2.3",
    "cloudpickle==3.1.2",
    "codetiming==1.4.0",
    "orjson==3.13.0",
    "ray==2.60.0",
    "msgpack==1.2.4",
    "protobuf==7.36.2",
    "jsonschema==4.26.0",
    "jsonschema-specifications==2025.9.1",
    "referencing==0.37.0",
    "rpds-py==2026.9.1",
    "attrs==26.1.0",
]


@pytest.fixture(scope="module")
def verl_site():
    site = Path(os.environ.get("TIRL_VERL_SITE", REPO / ".venv" / "verl-parity-0.9.1"))
    if not (site / "verl" / "trainer" / "ppo" / "core_algos.py").exists():
        cmd = [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps"]
        r = subprocess.run(
            [*cmd, "--target", str(site), *PACKAGES], capture_output=True, text=True, timeout=600
        )
        if r.returncode != 0:
            pytest.skip(f"verl 0.9.1 could not be installed for the parity tests: {r.stderr.strip()[-300:]}")
    return site


@pytest.fixture(scope="module")
def case(verl_site, tmp_path_factory):
    g = torch.Generator().manual_seed(0)
    B, T, V = 12, 7, 11
    loss_mask = (torch.rand(B, T, generator=g) > 0.3).float()
    loss_mask[3] = 0.0  # a sequence with no trained token
    inp = {
        # 3 groups of 4 with distinct rewards (no all-equal group: see the module docstring)
        "rewards": torch.tensor([1.0, -1.0, 0.5, -0.2, 1.0, 1.0, -1.0, 0.3, -0.6, 0.9, 0.1, -1.0]),
        "groups": [7, 7, 7, 7, 2, 2, 2, 2, 5, 5, 5, 5],
        "resp_mask": torch.ones(B, T),
        "logp": -torch.rand(B, T, generator=g) * 2,
        "adv": torch.randn(B, T, generator=g) * 2,
        "loss_mask": loss_mask,
        "values": torch.randn(B, T, generator=g),
        "ref_logp": -torch.rand(B, T, generator=g) * 2,
        "logits": torch.randn(B, T, V, generator=g) * 3,
        "clip_low": 0.2,
        "clip_high": 0.28,
        "clip_c": 3.0,
        "norm_len": 16,
    }
    # ratios spread over every branch: inside the clip range, both clip sides, and past the dual clip
    inp["old_logp"] = inp["logp"] + torch.randn(B, T, generator=g) * 0.8
    tmp = tmp_path_factory.mktemp("verl")
    torch.save(inp, tmp / "in.pt")
    r = subprocess.run(
        [
            sys.executable,
            str(HERE / "verl_reference.py"),
            str(verl_site),
            str(tmp / "in.pt"),
            str(tmp / "out.pt"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, f"verl reference run failed:\n{r.stderr[-2000:]}"
    return inp, torch.load(tmp / "out.pt")


@pytest.mark.parametrize("name", ["grpo", "drgrpo", "rloo"])
def test_advantages(case, name):
    inp, ref = case
    ours = get_advantage_estimator(name)(inp["rewards"], torch.tensor(inp["groups"]))
    torch.testing.assert_close(ours, ref[name][:, -1])


AGGS = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


def _loss_and_grad(name, inp, agg):
    """tirl's policy loss `name` on the case's inputs: (loss, d loss / d logp, stats)."""
    logp = inp["logp"].clone().requires_grad_(True)
    loss, stats = get_policy_loss(name)(
        logp,
        inp["old_logp"],
        inp["adv"],
        inp["loss_mask"],
        clip_low=inp["clip_low"],
        clip_high=inp["clip_high"],
        agg=agg,
        norm_len=inp["norm_len"],
        **({"clip_c": inp["clip_c"]} if name == "ppo" else {}),  # the dual clip is PPO's alone
    )
    loss.backward()
    return loss.detach(), logp.grad, stats


@pytest.mark.parametrize("agg", AGGS)
def test_policy_loss_value_gradient_and_clipfrac(case, agg):
    inp, ref = case
    ratio = (inp["logp"] - inp["old_logp"]).exp()
    assert (ratio < 0.8).any() and (ratio > 1.28).any()  # both clip sides are exercised
    assert ((inp["adv"] < 0) & (ratio > inp["clip_c"])).any()  # and the dual clip
    loss, grad, stats = _loss_and_grad("ppo", inp, agg)
    torch.testing.assert_close(loss, ref[f"pg/{agg}"])
    torch.testing.assert_close(grad, ref[f"pg_grad/{agg}"])
    assert stats["loss/clipfrac"] == pytest.approx(float(ref[f"clipfrac/{agg}"]), abs=1e-6)


@pytest.mark.parametrize("name", ["gspo", "cispo"])
@pytest.mark.parametrize("agg", AGGS)
def test_gspo_and_cispo(case, name, agg):
    inp, ref = case
    loss, grad, _ = _loss_and_grad(name, inp, agg)
    torch.testing.assert_close(loss, ref[f"{name}/{agg}"])
    torch.testing.assert_close(grad, ref[f"{name}_grad/{agg}"])


@pytest.mark.parametrize("agg", AGGS)
def test_aggregation(case, agg):
    inp, ref = case
    ours = aggregate(inp["values"], inp["loss_mask"], agg, norm_len=inp["norm_len"])
    torch.testing.assert_close(ours, ref[f"agg/{agg}"])


@pytest.mark.parametrize("est", ["k1", "k3"])
def test_kl(case, est):
    inp, ref = case
    torch.testing.assert_close(kl_penalty(inp["logp"], inp["ref_logp"], estimator=est), ref[f"kl/{est}"])


def test_entropy(case):
    inp, ref = case
    torch.testing.assert_close(entropy_from_logits(inp["logits"]), ref["entropy"])
