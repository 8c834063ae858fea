"""The static-shape decode behind `rollout.torch.cuda_graphs` (`tirl.rollout.engines.torch.graph_decode`), run eagerly on the
CPU (`capture=False`): the same ids and log-probs as the eager engine through padded buckets, compaction, stop
rules and kept prefixes; a step with no host synchronisation and the same operations on the same shapes at
every step of a bucket (what a CUDA graph replays); one read on the host per step; no expansion of grouped keys
and values; graphs kept across rollout phases (a fake capture); and the config key's checks. The capture itself
needs a GPU."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AutoModelForCausalLM, Qwen3Config
from transformers.integrations import sdpa_attention

from tirl.commands.run_config import TirlConfig
from tirl.core.config import ConfigError, load_config
from tirl.rollout.config import RolloutConfig
from tirl.rollout.engines.torch import graph_decode
from tirl.rollout.engines.torch.config import TorchEngineConfig
from tirl.rollout.engines.torch.engine import TorchEngine
from tirl.rollout.engines.torch.graph_arena import GIB
from tirl.rollout.engines.torch.graph_decode import GraphDecoder, capture_graph, why_not_graphs
from tirl.rollout.factory import EngineInputs, build_engine
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
BF16_LINE = 0.1  # engine/model log-prob gap under bf16 autocast: tests/gpu/test_gpu_torch.py's line


@pytest.fixture()
def sharp(model):
    """The tests' random model with its matrices scaled up: its greedy ids depend on the context (the plain one's
    greedy decode repeats one token for every prompt), so equal ids say something."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(8.0)
    return model


@pytest.fixture()
def qwen3(tokenizer):
    """A tiny Qwen3 (random weights, sharpened as `sharp`), tied embeddings as Qwen3-0.6B's: its key norm leaves
    the keys in fp32 under bf16 autocast while the values are bf16."""
    cfg = Qwen3Config(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=1024, tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa", dtype=torch.float32).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(8.0)
    return model


def _engine(model, tokenizer, static: bool, capture: bool = False, **kw) -> TorchEngine:
    eos = kw.pop("eos_ids", [tokenizer.eos_token_id])
    kv_gib = kw.pop("graph_kv_gib", 0.0)
    engine = TorchEngine(model, eos_ids=eos, pad_id=tokenizer.pad_token_id, pack="off", **kw)
    if static:
        engine.graphs = GraphDecoder(engine, capture=capture, kv_gib=kv_gib)
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


def _recomputed_gap(model, prompts, gens, autocast: torch.dtype | None) -> float:
    """The largest gap between the log-probs an engine reported and the model's own forward over the whole
    sequence (the trainer's view) under the same precision: the engine sampled from the weights the model holds."""
    worst, dev = 0.0, next(model.parameters()).device
    with (
        torch.no_grad(),
        torch.autocast(dev.type, dtype=autocast or torch.bfloat16, enabled=autocast is not None),
    ):
        for p, g in zip(prompts, gens, strict=True):
            logits = model(input_ids=torch.tensor([p + g.token_ids], device=dev)).logits[0].float().cpu()
            want = torch.log_softmax(logits, -1)[len(p) - 1 : -1].gather(
                -1, torch.tensor(g.token_ids)[:, None]
            )
            worst = max(worst, float((want.squeeze(-1) - torch.tensor(g.logprobs)).abs().max()))
    return worst


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
    """A model on `eager` attention: the static step's own attention gives what the eager engine's does."""
    sharp.set_attn_implementation("eager")
    engine = _engine(sharp, tokenizer, True)
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


def test_static_decode_under_bf16_autocast_samples_the_models_weights(qwen3, tokenizer, renderer):
    """RL's path, bf16 autocast over fp32 master weights, on Qwen3 (whose key norm leaves keys in fp32 under
    autocast): the static step runs bf16 copies of the Linears (the trainer's stay fp32; the norms and the
    embedding, which autocast leaves in fp32, are shared) over one bf16 arena for keys and values. Its log-probs
    are the model's own under autocast, as close as the eager engine's: bf16 attention rounds differently over
    another number of columns (0.017 and 0.029 here), so ids are not compared; stale weights miss by ~1."""
    kw = {"compute_dtype": torch.bfloat16, "max_batch_size": 8}
    prompts = _prompts(renderer)
    engine = _engine(qwen3, tokenizer, True, **kw)
    gens = _generate(engine, prompts, 1.0, LIMITS)
    assert [len(g.token_ids) for g in gens] == LIMITS
    assert _recomputed_gap(qwen3, prompts, gens, torch.bfloat16) < BF16_LINE
    arena = engine.graphs.arena
    assert {t.dtype for t in arena.keys + arena.values} == {torch.bfloat16}
    view = engine.graphs.weights.module
    assert view.lm_head.weight.dtype == torch.bfloat16 and qwen3.lm_head.weight.dtype == torch.float32
    assert view.model.layers[0].mlp.up_proj.weight.dtype == torch.bfloat16
    assert view.model.embed_tokens.weight is qwen3.model.embed_tokens.weight  # untied in the view only
    assert view.model.layers[0].self_attn.k_norm.weight is qwen3.model.layers[0].self_attn.k_norm.weight


def test_the_arena_is_sized_from_its_budget_and_refuses_what_it_cannot_hold(sharp, tokenizer, renderer):
    """`rollout.torch.graph_kv_gib` bounds the arena, allocated once: 1,024 slots hold 8 rows of 128 positions
    or, in the same memory, 2 rows of 192; 8 rows of 224 are refused with the numbers and the key to change."""
    cfg = sharp.config
    kv = cfg.num_key_value_heads * cfg.hidden_size // cfg.num_attention_heads
    slot = cfg.num_hidden_layers * 2 * kv * 4 + 1  # fp32 keys and values of every layer, one mask byte
    engine = _engine(sharp, tokenizer, True, max_batch_size=8, graph_kv_gib=(1024 * slot + 100) / GIB)
    prompts = _prompts(renderer)  # 10 to 47 tokens
    _generate(engine, prompts, 1.0, LIMITS)
    arena = engine.graphs.arena
    assert (
        arena.slots == 1024 and sum(t.nbytes for t in [*arena.keys, *arena.values, arena.mask]) == 1024 * slot
    )
    longer = _generate(engine, prompts[:2], 1.0, 150)
    assert engine.graphs.arena is arena
    _assert_same(_generate(_engine(sharp, tokenizer, False), prompts[:2], 1.0, 150), longer)
    with pytest.raises(ValueError, match=(
        r"5 rows needing 197 cache positions run at 8 rows x 224 positions = 1792 KV slots, but the arena holds "
        r"1024 .*raise rollout\.torch\.graph_kv_gib"
    )):  # fmt: skip
        _generate(engine, prompts, 1.0, 150)


def test_the_capture_is_thread_local_after_a_warm_up(monkeypatch):
    """The async agent's worker and tool threads may touch CUDA while a graph is captured: the capture's error
    mode is thread_local, after `WARMUP_STEPS` runs of the step outside it."""
    seen: dict = {"capturing": False}

    class Stream:
        def __init__(self, device=None) -> None:
            pass

        def wait_stream(self, other) -> None:
            pass

    class Graph:
        def __init__(self, graph, pool=None, capture_error_mode="global") -> None:
            seen.update(pool=pool, mode=capture_error_mode)

        def __enter__(self) -> None:
            seen["capturing"] = True

        def __exit__(self, *exc) -> None:
            seen["capturing"] = False

    for name, fake in {"Stream": Stream, "current_stream": lambda device=None: Stream(),
                       "stream": lambda s: contextlib.nullcontext(), "CUDAGraph": lambda: "graph",
                       "graph": Graph}.items():  # fmt: skip
        monkeypatch.setattr(torch.cuda, name, fake)
    runs = []
    graph = capture_graph(
        lambda: runs.append(seen["capturing"]), "pool", torch.device("cpu"), contextlib.nullcontext
    )
    assert graph == ("graph", "pool") and seen["mode"] == "thread_local" and seen["pool"] == "pool"
    assert runs == [False] * graph_decode.WARMUP_STEPS + [True]


class _FakeCapture:
    """`capture_graph` without CUDA: the step runs once as its capture and again at each replay."""

    def __init__(self) -> None:
        self.shapes: list[tuple[int, int]] = []

    def __call__(self, step, pool, device, amp) -> tuple[SimpleNamespace, str]:
        with amp():
            step()
        self.shapes.append(step.args)
        return SimpleNamespace(replay=step), "pool"


def test_graphs_and_their_arena_are_kept_across_rl_phases(qwen3, tokenizer, renderer, monkeypatch):
    """Two rollout phases (`awake`) with an in-place update and a sync between, under bf16 autocast: the second
    replays the graphs the first captured, over the same arena, and samples the new weights (the bf16 copies
    refreshed in place, where the graphs read them)."""
    fake = _FakeCapture()
    monkeypatch.setattr(graph_decode, "capture_graph", fake)
    engine = _engine(qwen3, tokenizer, True, True, compute_dtype=torch.bfloat16, max_batch_size=8)
    prompts = _prompts(renderer)
    with engine.awake():
        _generate(engine, prompts, 1.0, LIMITS)
    graphs, arena = dict(engine.graphs._graphs), engine.graphs.arena
    copies = [(c, c.data_ptr()) for c, _ in engine.graphs.weights.copies]
    assert len(fake.shapes) == len(graphs) >= 3
    with torch.no_grad():
        qwen3.model.layers[0].mlp.up_proj.weight.mul_(1.5)  # in place, as the optimizer's step
    engine.sync_weights(qwen3)
    with engine.awake():
        gens = _generate(engine, prompts, 1.0, LIMITS)
    assert (
        len(fake.shapes) == len(graphs) and engine.graphs._graphs == graphs and engine.graphs.arena is arena
    )
    assert all(c.data_ptr() == ptr for c, ptr in copies)
    assert _recomputed_gap(qwen3, prompts, gens, torch.bfloat16) < BF16_LINE  # stale copies: ~1


def test_the_static_step_never_expands_grouped_keys_and_values(model, tokenizer, renderer, monkeypatch):
    """transformers' SDPA wrapper copies grouped keys and values to every query head (`repeat_kv`) under a mask in
    some versions and, in all, while compiling (simulated here): the static step attends without it."""

    def expand(*args, **kwargs):
        raise AssertionError("repeat_kv in the static step")

    @contextlib.contextmanager
    def expanding():
        with monkeypatch.context() as patch:
            patch.setattr(sdpa_attention, "repeat_kv", expand)
            patch.setattr(sdpa_attention, "is_torchdynamo_compiling", lambda: True, raising=False)
            yield

    grouped = SimpleNamespace(num_key_value_groups=2, is_causal=True)
    q, kv, mask = torch.zeros(1, 4, 1, 16), torch.zeros(1, 2, 3, 16), torch.ones(1, 1, 1, 3, dtype=torch.bool)
    with (
        expanding(),
        pytest.raises(AssertionError, match="repeat_kv"),
    ):  # the patch reaches transformers' SDPA
        sdpa_attention.sdpa_attention_forward(grouped, q, kv, kv, mask)
    step = GraphDecoder._static_step

    def guarded(self, bk: int, ck: int) -> None:
        with expanding():
            step(self, bk, ck)

    monkeypatch.setattr(GraphDecoder, "_static_step", guarded)
    engine = _engine(model, tokenizer, True, max_batch_size=8)
    assert len(_generate(engine, _prompts(renderer), 1.0, LIMITS)[0].token_ids) == LIMITS[0]


def test_one_read_on_the_host_per_decode_step(sharp, tokenizer, renderer, monkeypatch):
    """A step's ids and log-probs reach the host in one read, and the live rows reach the device only when they
    change (on a GPU each read, and each upload from a Python list, waits for the device)."""
    counts = {"reads": 0, "uploads": 0, "steps": 0}
    tolist, tensor, as_tensor, sample = (
        torch.Tensor.tolist,
        torch.tensor,
        torch.as_tensor,
        graph_decode.sample_next,
    )

    def counted(key, fn):
        def call(*args, **kwargs):
            counts[key] += 1
            return fn(*args, **kwargs)

        return call

    monkeypatch.setattr(graph_decode, "sample_next", counted("steps", sample))
    loop = GraphDecoder._loop

    def recorded(self, *args) -> None:
        with monkeypatch.context() as m:
            m.setattr(torch.Tensor, "tolist", counted("reads", tolist))
            m.setattr(torch, "tensor", counted("uploads", tensor))
            m.setattr(torch, "as_tensor", counted("uploads", as_tensor))
            loop(self, *args)

    monkeypatch.setattr(GraphDecoder, "_loop", recorded)
    engine = _engine(sharp, tokenizer, True, max_batch_size=8, keep_prefix_mib=0)
    gens = _generate(engine, _prompts(renderer), 1.0, LIMITS)
    lengths = {len(g.token_ids) for g in gens}
    assert counts["steps"] == max(LIMITS) and counts["reads"] == counts["steps"]
    assert counts["uploads"] <= 1 + 2 * len(
        lengths
    )  # the first rows; per finishing step, rows and compaction


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


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")


@pytest.mark.gpu
@CUDA
def test_captured_decode_on_cuda(sharp, tokenizer, renderer):
    """The real path (`rollout.torch.cuda_graphs=on`): graphs captured per bucket, replayed by the next call and
    the next rollout phase; the same greedy ids as the eager engine and sampled ids and log-probs to float rounding
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
    with engine.awake():  # the next RL step's rollouts
        _generate(engine, prompts, 1.0, LIMITS)
    assert engine.graphs.captures == captured


@pytest.mark.gpu
@CUDA
def test_captured_decode_under_bf16_autocast_on_cuda(qwen3, tokenizer, renderer):
    """RL's path on the GPU: graphs captured under bf16 autocast over fp32 master weights (bf16 copies of the
    Linears, one bf16 arena), then an in-place update and a sync: the log-probs stay the model's own under
    autocast, to the bf16 line, without a new capture."""
    model = qwen3.cuda()
    prompts = _prompts(renderer)
    engine = _engine(
        model, tokenizer, False, cuda_graphs="on", compute_dtype=torch.bfloat16, max_batch_size=8
    )
    gens = _generate(engine, prompts, 1.0, LIMITS)
    assert _recomputed_gap(model, prompts, gens, torch.bfloat16) < BF16_LINE
    captured = engine.graphs.captures
    with torch.no_grad():
        model.model.layers[0].mlp.up_proj.weight.mul_(1.5)
    engine.sync_weights(model)
    gens = _generate(engine, prompts, 1.0, LIMITS)
    assert _recomputed_gap(model, prompts, gens, torch.bfloat16) < BF16_LINE
    assert engine.graphs.captures == captured


@pytest.mark.parametrize("static", [False, True], ids=["eager", "static"])
def test_autocasts_weight_cache_only_for_the_eager_decode(model, tokenizer, renderer, monkeypatch, static):
    """Under bf16 autocast the eager decode casts each weight once per call (autocast's cache); the static decode
    reads its own bf16 copy at every step, so a cache would only hold a second copy of every Linear through it."""
    seen = []
    chunk = TorchEngine._generate_chunk
    monkeypatch.setattr(
        TorchEngine,
        "_generate_chunk",
        lambda self, *a: seen.append(torch.is_autocast_cache_enabled()) or chunk(self, *a),
    )
    engine = _engine(model, tokenizer, static, compute_dtype=torch.bfloat16)
    assert len(_generate(engine, _prompts(renderer, 2), 1.0, [4, 4])) == 2
    assert seen == [not static]
