"""The static-shape decode behind `rollout.torch.cuda_graphs` (`tirl.rollout.graph_decode`), run eagerly on the
CPU (`capture=False`): the same ids and log-probs as the eager engine through padded buckets, compaction, stop
rules and kept prefixes; a step with no host synchronisation and the same operations on the same shapes at
every step of a bucket (what a CUDA graph replays); and the config key's checks. The capture itself needs a GPU."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tirl.commands.run_config import TirlConfig
from tirl.core.config import ConfigError, load_config
from tirl.rollout import graph_decode
from tirl.rollout.config import RolloutConfig, TorchEngineConfig
from tirl.rollout.engine import TorchEngine
from tirl.rollout.factory import EngineInputs, build_engine
from tirl.rollout.graph_decode import GraphDecoder, bucket, columns, why_not_graphs
from tirl.rollout.sampling import SamplingParams

QUESTIONS = (
    "What is 12 * 34?",
    "What is 1 + 2 + 3?",
    "A shop has 964 boxes with 59 pens each. How many?",
    "hi",
    "What is 7 - 5?",
)
LIMITS = [20, 7, 13, 9, 11]  # rows finish at different steps, so the live rows shrink through the buckets
# ops that read a tensor's value on the host (a synchronisation, which a capture cannot hold) or whose output shape
# depends on values
HOST_READS = ("_local_scalar_dense", "nonzero", "masked_select", "unique", "is_nonzero", "aten.equal")


@pytest.fixture()
def sharp(model):
    """The tests' random model with its matrices scaled up: its greedy ids depend on the context (the plain one's
    greedy decode repeats one token for every prompt), so equal ids say something."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(8.0)
    return model


def _engine(model, tokenizer, static: bool, **kw) -> TorchEngine:
    eos = kw.pop("eos_ids", [tokenizer.eos_token_id])
    engine = TorchEngine(model, eos_ids=eos, pad_id=tokenizer.pad_token_id, pack="off", **kw)
    if static:
        engine.graphs = GraphDecoder(engine, capture=False)
    return engine


def _prompts(renderer, n: int = len(QUESTIONS)) -> list[list[int]]:
    return [renderer.prompt_ids([{"role": "user", "content": q}]) for q in QUESTIONS[:n]]


def _generate(engine, prompts, temperature: float, limits, seed: int = 1):
    return engine.generate(
        prompts,
        SamplingParams(temperature=temperature),
        max_new_tokens=limits,
        generator=torch.Generator().manual_seed(seed),
    )


def _ender(gens, row: int, lo: int, hi: int) -> int:
    """A token at positions [lo, hi) of row `row` that neither it before `lo` nor any other row before `hi` has:
    made an EOS or stop id, it ends that row (and only it) within [lo, hi)."""
    before = {t for i, g in enumerate(gens) for t in g.token_ids[: lo if i == row else hi]}
    return next(t for t in gens[row].token_ids[lo:hi] if t not in before)


def _assert_same(eager, static) -> None:
    """Ids and finish reasons identical, log-probs within float rounding."""
    assert [g.token_ids for g in static] == [g.token_ids for g in eager]
    assert [g.finish_reason for g in static] == [g.finish_reason for g in eager]
    for e, s in zip(eager, static, strict=True):
        torch.testing.assert_close(torch.tensor(s.logprobs), torch.tensor(e.logprobs), atol=1e-5, rtol=0)


@pytest.mark.parametrize("max_batch_size", [8, 6])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_static_decode_gives_the_eager_engines_ids_and_logprobs(
    sharp, tokenizer, renderer, temperature, max_batch_size
):
    """5 rows (no bucket size) pad to a bucket of 8 (or the cap, 6); rows end on an EOS id, a stop id and their
    limits, so the steps run at smaller and smaller buckets; greedy and seeded sampling."""
    prompts = _prompts(renderer)
    free = _generate(_engine(sharp, tokenizer, False), prompts, temperature, LIMITS)
    # every row samples its first 6 tokens as in `free` (none ends before): row 0 stops, row 2 ends on an EOS
    # among them, after 3 steps at the first bucket
    stop, eos = _ender(free, 0, 3, 6), _ender(free, 2, 3, 6)
    kw = {"stop_ids": [stop], "eos_ids": [tokenizer.eos_token_id, eos], "max_batch_size": max_batch_size}
    eager = _generate(_engine(sharp, tokenizer, False, **kw), prompts, temperature, LIMITS)
    static_engine = _engine(sharp, tokenizer, True, **kw)
    static = _generate(static_engine, prompts, temperature, LIMITS)
    _assert_same(eager, static)
    assert {"eos", "stop", "length"} <= {g.finish_reason for g in eager}
    assert len({len(g.token_ids) for g in eager}) >= 3
    steps = static_engine.graphs.bucket_steps
    assert max(steps) == max_batch_size and len(steps) >= 3, steps  # padded, then compacted twice or more


def test_static_decode_with_eager_attention(sharp, tokenizer, renderer):
    """The additive mask `eager` attention takes gives the same as the boolean one sdpa takes."""
    sharp.set_attn_implementation("eager")
    engine = _engine(sharp, tokenizer, True)
    assert engine.graphs.mask_kind == "eager"
    prompts = _prompts(renderer)
    _assert_same(
        _generate(_engine(sharp, tokenizer, False), prompts, 1.0, LIMITS),
        _generate(engine, prompts, 1.0, LIMITS),
    )


def test_kept_prefixes_continue_in_the_static_decode(sharp, tokenizer, renderer):
    """A second turn that extends the first pre-fills only its new tokens over the prefixes the static decode kept
    (read from its arena): the same ids, log-probs and reused tokens as the eager engine."""
    prompts = _prompts(renderer)
    tail = renderer.prompt_ids([{"role": "user", "content": "And 5 + 5?"}])[-6:]
    results = []
    for static in (False, True):
        engine = _engine(sharp, tokenizer, static, max_batch_size=8)
        first = _generate(engine, prompts, 1.0, LIMITS)
        second = _generate(engine, [p + g.token_ids + tail for p, g in zip(prompts, first)], 1.0, 9, seed=2)
        results.append((first, second, engine.kept.reused_tokens))
    (first_e, second_e, reused_e), (first_s, second_s, reused_s) = results
    _assert_same(first_e, first_s)
    _assert_same(second_e, second_s)
    assert reused_s == reused_e == sum(len(p) + len(g.token_ids) - 1 for p, g in zip(prompts, first_e))


def test_the_arena_grows_between_calls_and_is_released_after_a_phase(sharp, tokenizer, renderer):
    """A call with more rows and a longer budget than the last reallocates the buffers; `awake` drops them."""
    prompts = _prompts(renderer)
    engine = _engine(sharp, tokenizer, True, max_batch_size=8)
    with engine.awake():
        _generate(engine, prompts[:2], 1.0, 5)
        assert engine.graphs.arena.mask.shape == (2, columns(len(prompts[2]) + 5))
        static = _generate(engine, prompts, 1.0, 150)
        assert engine.graphs.arena.mask.shape == (8, 256)
    assert engine.graphs.arena is None
    _assert_same(_generate(_engine(sharp, tokenizer, False), prompts, 1.0, 150), static)


class _Ops(TorchDispatchMode):
    """Records each aten op with its tensor arguments' shapes."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[str, tuple]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        shapes = tuple(tuple(a.shape) for a in args if isinstance(a, torch.Tensor))
        self.ops.append((str(func), shapes))
        return func(*args, **(kwargs or {}))


def test_the_static_step_is_capturable(model, tokenizer, renderer):
    """Every step reads no value on the host and, within a bucket, runs the same ops on the same shapes: what a
    CUDA graph records once and replays."""
    with _Ops() as control:
        torch.ones(2).sum().item()
    assert any(HOST_READS[0] in op for op, _ in control.ops)  # the recorder does see a host read
    engine = _engine(model, tokenizer, True, max_batch_size=8)
    step, runs = engine.graphs._static_step, {}

    def recorded(bk: int, ck: int) -> None:
        with _Ops() as rec:
            step(bk, ck)
        runs.setdefault((bk, ck), []).append(rec.ops)

    engine.graphs._static_step = recorded
    _generate(engine, _prompts(renderer), 1.0, LIMITS)
    assert sum(len(r) for r in runs.values()) == max(LIMITS) - 1
    for key, recs in runs.items():
        reads = [op for op, _ in recs[0] if any(r in op for r in HOST_READS)]
        assert not reads, (key, reads)
        assert all(r == recs[0] for r in recs[1:]), key
    assert any(len(r) >= 2 for r in runs.values())


def test_cuda_graphs_on_is_refused_on_a_cpu_and_auto_leaves_the_eager_decode(
    model, tokenizer, renderer, monkeypatch
):
    with pytest.raises(ValueError, match=r"rollout\.torch\.cuda_graphs=on: CUDA graphs need .* it is on cpu"):
        _engine(model, tokenizer, False, cuda_graphs="on")
    ro = RolloutConfig(torch=TorchEngineConfig(cuda_graphs="on"))
    with pytest.raises(ValueError, match=r"rollout\.torch\.cuda_graphs=on"):  # the factory passes the key on
        build_engine(ro, EngineInputs(model, tokenizer, tokenizer.eos_token_id, tokenizer.pad_token_id))
    with pytest.raises(ValueError, match=r"rollout\.torch\.cuda_graphs='yes'; valid: auto, on, off"):
        _engine(model, tokenizer, False, cuda_graphs="yes")
    with pytest.raises(ConfigError, match=r"rollout\.torch\.cuda_graphs must be one of auto, on, off"):
        load_config(TirlConfig, None, ["rollout.torch.cuda_graphs=yes"])

    def refuse(*args, **kwargs):
        raise AssertionError("the static decode ran on a CPU under cuda_graphs=auto")

    monkeypatch.setattr(GraphDecoder, "decode", refuse)
    auto = _engine(model, tokenizer, False, cuda_graphs="auto")
    assert auto.graphs is None
    prompts = _prompts(renderer)
    plain = _generate(_engine(model, tokenizer, False), prompts, 1.0, LIMITS)
    assert [g.token_ids for g in _generate(auto, prompts, 1.0, LIMITS)] == [g.token_ids for g in plain]


def test_what_keeps_a_model_from_graphs(model):
    assert "torch.compile" in why_not_graphs(model, compile=True)
    assert "it is on cpu" in why_not_graphs(model, compile=False)
    model.config._attn_implementation = "flash_attention_2"
    assert "'flash_attention_2'" in why_not_graphs(model, compile=False)
    model.config._attn_implementation = "sdpa"
    model.config.layer_types = ["sliding_attention", "full_attention"]
    assert "sliding-window" in why_not_graphs(model, compile=False)


def test_buckets_and_columns():
    assert [bucket(n, 8) for n in (1, 2, 3, 5, 8)] == [1, 2, 4, 8, 8]
    assert [bucket(n, 6) for n in (4, 5, 6)] == [4, 6, 6]
    assert [columns(n) for n in (1, graph_decode.MIN_COLUMNS, 129, 256, 257)] == [128, 128, 256, 256, 512]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
def test_captured_decode_on_cuda(sharp, tokenizer, renderer):
    """The real path (`rollout.torch.cuda_graphs=on`): graphs captured per bucket, reused by the next call, dropped
    after a rollout phase; the same greedy ids as the eager engine and sampled ids and log-probs to float rounding
    (the eager decode's attention runs another kernel)."""
    model = sharp.cuda()
    prompts = _prompts(renderer)
    engine = _engine(model, tokenizer, False, cuda_graphs="on", max_batch_size=8)
    eager = _engine(model, tokenizer, False, max_batch_size=8)
    assert engine.graphs is not None and engine.graphs.capture
    with engine.awake():
        for temperature in (0.0, 1.0):
            want, got = (_generate(e, prompts, temperature, LIMITS) for e in (eager, engine))
            assert [g.token_ids for g in got] == [g.token_ids for g in want]
            for w, g in zip(want, got, strict=True):
                torch.testing.assert_close(
                    torch.tensor(g.logprobs), torch.tensor(w.logprobs), atol=1e-4, rtol=0
                )
        captured = engine.graphs.captures
        assert captured >= 3 and len(engine.graphs.bucket_steps) >= 3
        _generate(engine, prompts, 1.0, LIMITS)
        assert engine.graphs.captures == captured  # the same buckets replay the graphs already captured
    assert engine.graphs.arena is None and not engine.graphs._graphs
