"""What reaches the RL trainer from the command: `assemble` takes each input of `RLRun` by a named, typed
parameter, and `LossSpec.for_rl` carries every setting the losses share from its `rl.*` key."""

import inspect
from dataclasses import dataclass, fields

from tirl.algorithms import LossOptions, PPOOptions
from tirl.train.rl.config import KLConfig, RLConfig
from tirl.train.rl.run import RLRun, assemble
from tirl.train.rl.update import RL_KEY, LossSpec

# the shared rl.loss.* keys the trainer resolves before the spec is built: the loss function and the length
RESOLVED = {"loss.name", "loss.norm_len"}
# RLRun's fields that assemble computes from its parameters
COMPUTED = {"rows", "micro_budget", "engine_caps", "reference"}


def _unread(spec: type) -> set[str]:
    """The settings every loss shares (`LossOptions`' own fields, `rl.kl.*`) that no field of `spec` reads."""
    read = {f.metadata[RL_KEY] for f in fields(spec) if RL_KEY in f.metadata}
    shared = {f"loss.{f.name}" for f in fields(LossOptions)} | {f"kl.{f.name}" for f in fields(KLConfig)}
    return shared - RESOLVED - read


def test_the_check_finds_a_shared_setting_no_field_reads():
    @dataclass
    class Forgetful(LossSpec):
        kl_estimator: str = "k3"  # declared without from_rl: nothing reads rl.kl.estimator

    assert _unread(Forgetful) == {"kl.estimator"}


def test_every_shared_loss_setting_has_a_spec_field_that_reads_it():
    assert _unread(LossSpec) == set()


def test_a_spec_built_from_a_config_carries_each_setting_it_reads():
    loss = PPOOptions(agg="seq-mean-token-sum-norm", token_mean="micro", clip_c=4.0)
    cfg = RLConfig(
        micro_batch_size=3,
        micro_batch_tokens=77,
        entropy_coef=0.25,
        share_prefix=True,  # LossSpec's own default is False
        kl=KLConfig(coef=0.5, estimator="k1"),
        loss=loss,
    )
    spec = LossSpec.for_rl(cfg, loss_fn=print, norm_len=9, temperature=0.7, autocast=None)
    assert {f.name: getattr(spec, f.name) for f in fields(spec) if RL_KEY in f.metadata} == {
        "agg": "seq-mean-token-sum-norm",
        "kl_coef": 0.5,
        "kl_estimator": "k1",
        "entropy_coef": 0.25,
        "micro_batch_size": 3,
        "micro_batch_tokens": 77,
        "token_mean": "micro",
        "share_prefix": True,
    }
    assert (spec.loss_fn, spec.hyper, spec.norm_len, spec.temperature) == (
        print,
        {"clip_low": 0.2, "clip_high": 0.28, "clip_c": 4.0},
        9,
        0.7,
    )


def test_assemble_takes_each_input_of_the_run_by_a_typed_name():
    params = inspect.signature(assemble).parameters.values()
    assert [p.name for p in params if p.kind is p.VAR_KEYWORD or p.annotation is p.empty] == []
    assert {f.name for f in fields(RLRun)} - COMPUTED - {p.name for p in params} == set()
