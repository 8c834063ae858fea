"""tirl's profiling regions (`tirl.core.regions`): nothing without a profiler (the decode draws the same ids with
and without one), under one each part of a decode step (eager and static) and of an update is its own span, and
`bench gpu --profile`'s per-region table reads them."""

from __future__ import annotations

import contextlib

import pytest
import torch
from bench.gpu_profile import region_table
from torch.profiler import ProfilerActivity, profile

from tirl.algorithms import get_policy_loss
from tirl.core.regions import REGIONS, region
from tirl.rollout.engines.torch.engine import TorchEngine
from tirl.rollout.engines.torch.graph_decode import GraphDecoder
from tirl.rollout.sampling import SamplingParams
from tirl.train.batch import TokenBatch
from tirl.train.optim import OptimConfig, build_optimizer, clip_and_step
from tirl.train.rl.update import LossSpec, accumulate_gradients

DECODE = {r for r in REGIONS if r.startswith("tirl/decode/")}
UPDATE = {r for r in REGIONS if r.startswith("tirl/update/")}
NEW = 6


def test_a_region_is_nothing_without_a_profiler_and_refuses_an_unknown_name():
    assert isinstance(region("tirl/decode/sample"), contextlib.nullcontext)
    with pytest.raises(ValueError, match="unknown profiling region 'tirl/decode/smaple'"):
        region("tirl/decode/smaple")
    with profile(activities=[ProfilerActivity.CPU]):
        assert not isinstance(region("tirl/decode/sample"), contextlib.nullcontext)


def _decode(engine: TorchEngine, prompts: list[list[int]]) -> list:
    params = SamplingParams(temperature=1.0)
    return engine.generate(prompts, params, max_new_tokens=NEW, generator=torch.Generator().manual_seed(3))


@pytest.mark.parametrize("static", [False, True], ids=["eager", "static"])
def test_each_part_of_a_decode_step_is_its_own_region(model, tokenizer, renderer, static):
    engine = TorchEngine(model, eos_ids=[-1], pad_id=tokenizer.pad_token_id, pack="off")  # never drawn
    if static:
        engine.graphs = GraphDecoder(engine, capture=False)
    prompts = [renderer.prompt_ids([{"role": "user", "content": q}]) for q in ("hi", "What is 7 - 5?")]
    plain = _decode(engine, prompts)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        profiled = _decode(engine, prompts)
    assert [g.token_ids for g in profiled] == [g.token_ids for g in plain]  # a region changes no number
    assert [g.logprobs for g in profiled] == [g.logprobs for g in plain]
    table = region_table(prof, NEW)
    assert set(table) == DECODE
    assert table["tirl/decode/prefill"]["calls_per_step"] == pytest.approx(1 / NEW)
    assert table["tirl/decode/sample"]["calls_per_step"] == pytest.approx(1.0)  # one draw per new token
    assert table["tirl/decode/step"]["calls_per_step"] == pytest.approx(
        (NEW - 1) / NEW
    )  # the last feeds none
    assert all(row["host_ms_per_step"] > 0 and row["device_ms_per_step"] == 0 for row in table.values())


def test_the_forward_backward_and_optimizer_of_an_update_are_regions(model):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (2, 12), generator=g)
    mask = torch.ones_like(ids)
    batch = TokenBatch(ids, mask, mask.clone(), {"advantages": torch.randn(2, 12, generator=g)})
    spec = LossSpec(get_policy_loss("ppo"), hyper={"clip_low": 0.2, "clip_high": 0.28, "clip_c": 10.0},
                    agg="token-mean", norm_len=12, temperature=1.0, micro_batch_size=1)  # fmt: skip
    cfg = OptimConfig(lr=1e-4)
    opt, sched = build_optimizer(model, cfg, 2)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        stats = accumulate_gradients(model, batch, None, None, spec)
        clip_and_step(model, opt, sched, cfg, loss=stats["loss/total"])
    table = region_table(prof, 1)
    assert set(table) == UPDATE
    assert (
        table["tirl/update/forward"]["calls_per_step"] == table["tirl/update/backward"]["calls_per_step"] == 2
    )
    assert table["tirl/update/optimizer"]["calls_per_step"] == 1


def test_bench_gpus_profile_carries_the_region_table(model, tokenizer, renderer):
    from bench.gpu import where_time_goes

    engine = TorchEngine(model, eos_ids=[-1], pad_id=tokenizer.pad_token_id, pack="off")
    prompts = [renderer.prompt_ids([{"role": "user", "content": "hi"}])]
    prof = where_time_goes(lambda: _decode(engine, prompts), "cpu", NEW)
    assert set(prof["regions"]) == DECODE and prof["steps"] == NEW
    assert sum(r["host_ms_per_step"] for r in prof["regions"].values()) <= prof["wall_ms_per_step"] * 1.01
