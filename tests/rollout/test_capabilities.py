"""Engine capabilities: each rule on hand-made records, the declared records of the real engines, and the factory."""

import dataclasses

import pytest
import torch

from tirl.rollout import factory
from tirl.rollout.agent.async_loop import AsyncAgentLoop
from tirl.rollout.agent.loop import AgentLoop
from tirl.rollout.capabilities import EngineCapabilities, capabilities_of
from tirl.rollout.config import RolloutConfig
from tirl.rollout.factory import ENGINES, EngineInputs, agent_loop, build_engine, capabilities_for
from tirl.rollout.sampling import SamplingParams
from tirl.train.rl.check import check_rl_sampling, rl_refusal, why_not_rl

SHARED = EngineCapabilities(
    name="inproc", weight_sync="shared", logprobs="full", per_request_seeds=False, multi_process=True,
    batches_requests=False,
)  # fmt: skip
SERVER = EngineCapabilities(
    name="server", weight_sync="disk", logprobs="renormalized", per_request_seeds=True, multi_process=False,
    batches_requests=True,
)  # fmt: skip
EVAL_ONLY = dataclasses.replace(SERVER, name="remote", weight_sync="none")


def test_record_is_validated_and_frozen():
    with pytest.raises(ValueError, match="weight_sync='nccl'; valid: shared, disk, memory, none"):
        dataclasses.replace(SERVER, weight_sync="nccl")
    with pytest.raises(ValueError, match="logprobs='raw'"):
        dataclasses.replace(SERVER, logprobs="raw")
    with pytest.raises(ValueError, match="needs the engine's name"):
        dataclasses.replace(SERVER, name="")
    with pytest.raises(dataclasses.FrozenInstanceError):
        SERVER.multi_process = True  # type: ignore[misc]


def test_weight_sync_properties():
    assert SHARED.shares_policy and SHARED.receives_weights and not SHARED.sync_on_resume
    assert not SERVER.shares_policy and SERVER.receives_weights and SERVER.sync_on_resume
    memory = dataclasses.replace(SERVER, weight_sync="memory")
    assert memory.receives_weights and memory.sync_on_resume
    assert not EVAL_ONLY.receives_weights and not EVAL_ONLY.sync_on_resume


def test_why_not_rl():
    assert why_not_rl(SHARED, 1) is None and why_not_rl(SHARED, 8) is None
    assert why_not_rl(SERVER, 1) is None
    assert "rollout.engine=server cannot run under torchrun" in why_not_rl(SERVER, 2)
    assert why_not_rl(dataclasses.replace(SERVER, multi_process=True), 2) is None
    assert "cannot receive the policy's new weights" in why_not_rl(EVAL_ONLY, 1)


def test_rl_refusal_names_the_engines_that_can():
    assert rl_refusal(SERVER, 1) is None
    one = rl_refusal(EVAL_ONLY, 1)
    assert one.startswith("rollout.engine=remote cannot receive") and one.endswith(
        "use rollout.engine=torch or vllm for tirl rl"
    )
    several = rl_refusal(SERVER, 4)
    assert several.endswith("use rollout.engine=torch or vllm for tirl rl on several processes")


def test_truncated_sampling_only_with_full_vocabulary_logprobs():
    for params in (SamplingParams(top_p=0.9), SamplingParams(top_k=5)):
        with pytest.raises(ValueError, match="with the server engine: its log-probs are renormalized"):
            check_rl_sampling(SERVER, params)
        check_rl_sampling(SHARED, params)
    check_rl_sampling(SERVER, SamplingParams(top_p=1.0, top_k=-1))


def test_rollout_loop():
    assert SHARED.rollout_loop("auto") == "lockstep" and SERVER.rollout_loop("auto") == "async"
    assert SHARED.rollout_loop("async") == "async" and SERVER.rollout_loop("lockstep") == "lockstep"
    with pytest.raises(ValueError, match="unknown rollout.mode 'fast'; valid: lockstep, async, auto"):
        SHARED.rollout_loop("fast")


def test_rollout_correction_and_old_logprobs():
    assert SHARED.rollout_correction("auto") == "none" and SERVER.rollout_correction("auto") == "token_tis"
    assert SHARED.rollout_correction("seq_mis") == "seq_mis" and SERVER.rollout_correction("none") == "none"

    def source(caps, on_policy=True, correction="none", fresh=True, mode="auto"):
        return caps.old_logprobs(on_policy=on_policy, correction=correction, fresh=fresh, mode=mode)

    assert source(SHARED) == "policy"  # one update over the whole batch
    assert (
        source(SHARED, on_policy=False) == "engine"
    )  # several mini-batches: the sampling log-probs are old ones
    assert source(SHARED, on_policy=False, fresh=False) == "recompute"  # sampled with older weights (overlap)
    assert source(SHARED, correction="token_tis") == "policy"  # corrected in the update's own pass
    assert source(SHARED, on_policy=False, correction="token_tis") == "recompute"
    assert (
        source(SHARED, on_policy=False, mode="recompute") == source(SHARED, mode="recompute") == "recompute"
    )
    assert (
        source(SERVER) == "policy"
    )  # on-policy: the mismatch is measured and corrected in the update's pass
    assert source(SERVER, on_policy=False) == "recompute"  # to measure the mismatch before the first update
    with pytest.raises(ValueError, match="rl.old_logprobs='engine'; valid: auto, recompute"):
        source(SHARED, mode="engine")


def test_seed_kwargs():
    assert SERVER.seed_kwargs(7) == {"seeds": [7]}
    g = SHARED.seed_kwargs(7)["generator"]
    assert torch.equal(torch.rand(3, generator=g), torch.rand(3, generator=torch.Generator().manual_seed(7)))


def test_real_engines_declare_what_they_do():
    torch_caps, vllm_caps, openai_caps = (capabilities_for(n) for n in ("torch", "vllm", "openai"))
    assert set(ENGINES) == {"torch", "vllm", "openai"}
    assert torch_caps.shares_policy and torch_caps.logprobs == "full" and torch_caps.multi_process
    assert not torch_caps.per_request_seeds and not torch_caps.batches_requests
    assert (
        vllm_caps.weight_sync == "disk"
        and vllm_caps.logprobs == "renormalized"
        and vllm_caps.batches_requests
        and vllm_caps.multi_process  # placement separate: ranks share the servers (tirl.rollout.engines.vllm.pool)
    )
    assert openai_caps.weight_sync == "none" and openai_caps.per_request_seeds
    assert [capabilities_for(n).name for n in ENGINES] == list(ENGINES)
    assert set(factory._ENGINES) == set(ENGINES)  # a builder for every name the config accepts, and no other
    with pytest.raises(ValueError, match="unknown rollout.engine 'sglang'; valid: openai, torch, vllm"):
        capabilities_for("sglang")


def test_undeclared_engine_is_an_error_that_says_what_to_add():
    with pytest.raises(TypeError, match="object declares no `capabilities`"):
        capabilities_of(object())


def test_factory_builds_checks_and_picks_the_loop(model, tokenizer, renderer, sandbox):
    from tirl.rollout.agent.loop import AgentConfig

    inputs = EngineInputs(model, tokenizer, renderer.eos_id, renderer.pad_id)
    engine = build_engine(RolloutConfig(), inputs)
    assert capabilities_of(engine) == capabilities_for("torch") and engine.model is model
    assert type(agent_loop(RolloutConfig(), engine, renderer, sandbox, AgentConfig())) is AgentLoop
    assert (
        type(agent_loop(RolloutConfig(mode="async"), engine, renderer, sandbox, AgentConfig()))
        is AsyncAgentLoop
    )
    bad = dataclasses.replace(inputs, pad_id=model.get_input_embeddings().num_embeddings)
    with pytest.raises(ValueError, match=r"pad_id reaches id \d+ but the model's embedding has \d+ rows"):
        build_engine(RolloutConfig(), bad)


def test_bf16_on_either_side_means_the_logprobs_are_recomputed_and_corrected():
    assert SHARED.with_precision(None, None) is SHARED and SHARED.exact_logprobs
    for engine_dtype, trainer_dtype in ((torch.bfloat16, None), (None, torch.bfloat16)):
        caps = SHARED.with_precision(engine_dtype, trainer_dtype)
        assert caps.shares_policy and not caps.exact_logprobs  # still nothing to copy, but other numbers
        assert caps.rollout_correction("auto") == "token_tis"
        assert caps.old_logprobs(on_policy=False, correction="none", fresh=True) == "recompute"


def test_factory_builds_a_bf16_torch_engine_and_refuses_other_dtypes(model, tokenizer, renderer):
    inputs = EngineInputs(model, tokenizer, renderer.eos_id, renderer.pad_id)
    engine = build_engine(RolloutConfig(dtype="bfloat16"), inputs)
    assert engine.compute_dtype is torch.bfloat16 and not capabilities_of(engine).same_numerics
    assert build_engine(RolloutConfig(dtype="float32"), inputs).compute_dtype is None
    with pytest.raises(ValueError, match=r"rollout.dtype='float16' with the torch engine"):
        build_engine(RolloutConfig(dtype="float16"), inputs)
