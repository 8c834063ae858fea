"""`tirl plan --gpus N`: the weight sync's bytes and seconds (each trainer node streaming its share of the servers),
the step's phases and the split search against numbers computed by hand, the splits it refuses, and the CLI (text,
JSON, errors). No weights are loaded: the bundled
Qwen3-4B architecture on the meta device."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from tirl.commands.run_config import TirlConfig
from tirl.core.config import load_config
from tirl.train.plan import PlanError, load_arch, meta_model
from tirl.train.plan_cluster import cluster_plan, default_tp, spans, sync_sends
from tirl.train.plan_step import (
    Assumptions,
    SyncCopy,
    TrainShape,
    rollout_seconds,
    step_time,
    sync_copy,
    trainer_seconds,
    weight_sync,
)

CONFIGS = Path(__file__).resolve().parents[1] / "src" / "tirl" / "configs"
QWEN3_4B = "qwen3-4b-instruct-2507"
PARAMS = 4_022_468_096  # Qwen3-4B (tests/test_plan.py counts it by hand)
EMBEDDING = 151_936 * 2_560  # tied: the servers get it a second time, as lm_head


def recipe(*overrides: str) -> TirlConfig:
    return load_config(TirlConfig, CONFIGS / "recipe-qwen3-4b-grpo-tcr.yaml", list(overrides))


def figures(**kw: float) -> Assumptions:
    base = dict(
        decode_tps=1000.0, seq_tps=50.0, prompt_tokens=10.0, response_tokens=40.0, longest_tokens=2000.0,
        turns=3.0, tool_s=2.0, mfu=0.5, peak_flops=1e12, link_gbps=100.0, loopback_gbps=8.0,
    )  # fmt: skip
    return Assumptions(**(base | kw))


def test_the_sync_sends_the_served_dtype_and_the_tied_embedding_twice():
    """The recipe trains float32 master weights and serves bfloat16: the gathers move 4 B a value, the wire 2 B
    (rank 0 casts each tensor as it comes), and the tied embedding goes a second time as lm_head. Served in float32
    the wire carries 4 B; colocated nothing is sent and nothing untied."""
    _, hf = load_arch("", QWEN3_4B)
    model = meta_model(hf)
    got = sync_copy(recipe(), model, untie=True, served="bfloat16")
    assert got == SyncCopy(PARAMS + EMBEDDING, (PARAMS + EMBEDDING) * 2, "bfloat16", PARAMS * 4)
    got = sync_copy(recipe(), model, untie=True, served="float32")
    assert got == SyncCopy(PARAMS + EMBEDDING, (PARAMS + EMBEDDING) * 4, "float32", PARAMS * 4)
    assert sync_copy(recipe(), model, untie=False) == SyncCopy(PARAMS, PARAMS * 4, "float32", PARAMS * 4)


def test_a_merged_lora_weight_is_gathered_in_float32():
    """bf16 base, rank-8 adapter on all linear layers: base + the float32 delta is float32 until the cast to the
    served bf16. Adapted weights per layer q 2560x4096 + k, v 2 x 2560x1024 + o 4096x2560 + gate, up, down
    3 x 2560x9728 = 100,925,440, x 36 layers."""
    cfg = recipe("model.dtype=bfloat16", "model.autocast=none", "model.lora.rank=8")
    _, hf = load_arch("", QWEN3_4B)
    model = meta_model(hf, cfg.model.lora)
    adapted = 36 * 100_925_440
    gathered = adapted * 4 + (PARAMS - adapted) * 2
    assert sync_copy(cfg, model, untie=True, served="bfloat16") == SyncCopy(
        PARAMS + EMBEDDING, (PARAMS + EMBEDDING) * 2, "bfloat16", gathered
    )
    assert sync_copy(cfg, model, untie=False).wire_dtype == "bfloat16 (adapted layers float32)"


def test_sync_seconds_at_each_link_speed_are_the_slowest_nodes():
    """2 trainer nodes sending at once, 2e9 B a copy sent, 4e9 B gathered (half over each node's link): node 0 feeds
    1 receiver on another node and 1 on its own (loopback 8 Gb/s = 1e9 B/s: 2 s), node 1 feeds 3 on other nodes.
    At 5 Gb/s (0.625e9 B/s) node 1 is the slower: 6e9 B in 9.6 s against 3.2 + 2 s, + the gather's 3.2 s = 12.8 s;
    at 25: node 0, 0.64 + 2 s against 1.92 s, + 0.64 s = 3.28 s; at 100: 2.16 + 0.16 s; at 400: 2.04 + 0.04 s."""
    copy = SyncCopy(10**9, 2 * 10**9, "bfloat16", 4 * 10**9)
    got = weight_sync(copy, sends=[(1, 1), (3, 0)], trainer_nodes=2, a=figures(link_gbps=5.0))
    assert (got.receivers, got.local_receivers, got.sending_nodes) == (5, 1, 2)
    assert (got.bytes_per_step, got.busiest_link_bytes, got.gather_link_bytes) == (10e9, 6e9, 2e9)
    assert got.seconds == pytest.approx({"5": 12.8, "25": 3.28, "100": 2.32, "400": 2.08})
    none = weight_sync(copy, sends=[], trainer_nodes=2, a=figures())  # colocated
    assert (none.receivers, none.sending_nodes, none.busiest_link_bytes) == (0, 0, 0)
    assert none.seconds["100"] == pytest.approx(2e9 / 12.5e9)


def test_servers_are_dealt_to_trainer_nodes_as_sync_share_deals_them():
    """Rank order [0, 8, 1, 9, ...] with 2 trainer nodes of 8: 16 servers (GPUs 16-31) give 8 to each node, all on
    other nodes; 3 tp-4 servers give servers 0, 2 (8 workers) to node 0 and server 1 (4) to node 1; 5 servers on
    GPUs 16-20: 0, 2, 4 to node 0, 1, 3 to node 1. One trainer node of 4 ranks with 12 servers on GPUs 4-15: ranks
    0-3 take 3 each, servers 0-3 on its own node. 4 trainers and 4 servers on one node of 8: all local."""
    assert sync_sends(16, 16, 1, 8) == [(8, 0), (8, 0)]
    assert sync_sends(16, 3, 4, 8) == [(8, 0), (4, 0)]
    assert sync_sends(16, 5, 1, 8) == [(3, 0), (2, 0)]
    assert sync_sends(4, 12, 1, 8) == [(8, 4)]
    assert sync_sends(4, 4, 1, 8) == [(0, 4)]
    assert sync_sends(32, 32, 1, 8) == [(8, 0)] * 4


def test_recipe_sync_on_32_gpus_computed_by_hand():
    """16 servers (tp 1) on GPUs 16-31 (nodes 2, 3), each sent 8,822,848,512 B of bf16; 16 training GPUs on 2 nodes,
    each streaming to 8 of the servers over its own link, which also carries half of the float32 gathers
    (8,044,936,192 B): (8 x 8,822,848,512 + 8,044,936,192) B at 25 Gb/s = 25.161 s."""
    _, c = cluster_plan(recipe(), gpus=32, rollout_gpus=16, arch=QWEN3_4B)
    copy, gathered = (PARAMS + EMBEDDING) * 2, PARAMS * 4
    assert (copy, gathered // 2) == (8_822_848_512, 8_044_936_192)
    assert (c.sync.receivers, c.sync.local_receivers, c.sync.bytes_per_step) == (16, 0, 16 * copy)
    assert (c.sync.sending_nodes, c.sync.busiest_link_bytes) == (2, 8 * copy)
    for gbps in (25, 100, 400):
        assert c.sync.seconds[str(gbps)] == pytest.approx((8 * copy + gathered / 2) / (gbps * 1e9 / 8))
    assert c.sync.seconds["25"] == pytest.approx(25.161, abs=1e-3)
    assert c.step.sync_s == c.sync.seconds["100"]


def test_recipe_sync_on_one_node_goes_over_loopback():
    """8 GPUs, 4 + 4: ranks 0-3 each stream one server on the same node, so nothing crosses a link and no gather
    does: 4 x 8,822,848,512 B at --loopback-gbps 5.8 (0.725e9 B/s) = 48.677 s at every link speed."""
    _, c = cluster_plan(recipe(), gpus=8, rollout_gpus=4, arch=QWEN3_4B)
    copy = (PARAMS + EMBEDDING) * 2
    assert (c.sync.receivers, c.sync.local_receivers, c.sync.sending_nodes) == (4, 4, 1)
    assert (c.sync.busiest_link_bytes, c.sync.gather_link_bytes) == (0, 0)
    assert c.sync.seconds == pytest.approx({g: 4 * copy / 0.725e9 for g in ("25", "100", "400")})
    assert c.sync.seconds["25"] == pytest.approx(48.677, abs=1e-3)


def test_recipe_sync_with_servers_dealt_unevenly():
    """21 GPUs, 16 + 5 (8 a node): servers 0, 2, 4 from node 0, servers 1, 3 from node 1, all on node 2; the
    busiest sends 3 copies: (3 x 8,822,848,512 + 8,044,936,192) B at 100 Gb/s = 2.761 s."""
    _, c = cluster_plan(recipe(), gpus=21, rollout_gpus=5, arch=QWEN3_4B)
    copy, gathered = (PARAMS + EMBEDDING) * 2, PARAMS * 4
    assert (c.sync.receivers, c.sync.local_receivers, c.sync.sending_nodes) == (5, 0, 2)
    assert (c.sync.bytes_per_step, c.sync.busiest_link_bytes) == (5 * copy, 3 * copy)
    assert c.sync.seconds["100"] == pytest.approx((3 * copy + gathered / 2) / 12.5e9)
    assert c.sync.seconds["100"] == pytest.approx(2.761, abs=1e-3)


def test_tensor_parallel_servers_take_one_copy_per_worker():
    """2 servers of tp 4 on node 1: every worker connects to the stream and gets every tensor, so 8 copies, all
    over the one trainer node's link."""
    _, c = cluster_plan(recipe(), gpus=16, rollout_gpus=8, tp=4, arch=QWEN3_4B)
    assert (c.split.servers, c.sync.receivers, c.sync.sending_nodes) == (2, 8, 1)
    assert c.sync.bytes_per_step == c.sync.busiest_link_bytes == 8 * (PARAMS + EMBEDDING) * 2


def test_rollout_takes_the_larger_bound_plus_the_tools():
    """16 in flight at 50 tokens/s each: a server decodes min(1000, 800) = 800 tokens/s. 64 x 40 tokens over 4
    servers: 0.8 s, below the longest trajectory's 2000 / 50 = 40 s; 2048 trajectories of 500: 320 s. Tools 3 x 2 s."""
    seconds, bound, detail = rollout_seconds(figures(), 64, 4, 16)
    assert (seconds, bound, detail["server_tokens_per_s"]) == (46.0, "longest trajectory", 800.0)
    seconds, bound, _ = rollout_seconds(figures(response_tokens=500.0), 2048, 4, 16)
    assert (seconds, bound) == (326.0, "throughput")
    assert rollout_seconds(figures(response_tokens=500.0), 2048, 4, 64)[0] == 2048 * 500 / 4000 + 6


def test_trainer_flops_and_fsdp_traffic_on_a_tiny_shape():
    """1e6 parameters, 8 trajectories of 10 + 40 tokens = 400 tokens, 2 GPUs at 0.5 x 1e12 FLOP/s: forward 2 x 1e6
    x 400 = 8e8 FLOP (0.8 ms), update 6 x (8 with checkpointing) 1e6 x 400. On 2 nodes at 0.008 Gb/s (1e6 B/s):
    ceil(4 x 50 / 100) = 2 micro-batches a rank, 4e6 B of float32 weights, half of it over the link: forward 2 x 4e6
    x 0.5 = 4e6 B (4 s); update 2 x (2 gathers + float32 gradients) x 4e6 x 0.5 = 12e6 B (12 s)."""
    shape = TrainShape(
        params=10**6, trainable=10**6, trajectories=8, trainer_gpus=2, trainer_nodes=1, epochs=1, mini_batch=8,
        micro_batch_tokens=100, checkpointing=False, reshard=True, old_logprobs=True, reference=True,
        weight_bytes=4, grad_bytes=4,
    )  # fmt: skip
    old, ref, update, detail = trainer_seconds(shape, figures())
    assert (old, ref) == pytest.approx((8e-4, 8e-4)) and update == pytest.approx(2.4e-3)
    assert detail["trained_tokens"] == 400 and detail["update_flops"] == 2.4e9
    ckpt = replace(shape, checkpointing=True, old_logprobs=False, reference=False)
    assert trainer_seconds(ckpt, figures())[:3] == pytest.approx((0.0, 0.0, 3.2e-3))
    nodes = replace(shape, trainer_nodes=2)
    old, ref, update, detail = trainer_seconds(nodes, figures(link_gbps=0.008))
    assert (detail["forward_link_bytes"], detail["update_link_bytes"]) == (4e6, 12e6)
    assert (old, update) == pytest.approx((4.0, 12.0))


def test_step_total_shares_and_overlap():
    t = step_time((100.0, "throughput", {}), (10.0, 5.0, 30.0, {}), 5.0)
    assert t.total_s == 150.0 and t.overlapped_s == 100.0 + 5.0
    assert t.shares == pytest.approx({"rollout": 2 / 3, "old_logprobs": 0.1 / 1.5, "reference": 0.05 / 1.5,
                                      "update": 0.3 / 1.5, "sync": 0.05 / 1.5})  # fmt: skip


def test_the_split_search_takes_the_argmin_computed_by_hand():
    """8 GPUs on one node, 1024 trajectories of 1000 response tokens, servers at 1000 tokens/s (every server has
    enough in flight at 1e6 tokens/s a sequence: the longest trajectory takes 0.02 s), no tools; trainer at 0.5 x 1e15
    FLOP/s a GPU, checkpointing (8 x params a token) plus the old log-probs' forward (2 x); every receiver on the
    one node, at 8 Gb/s (1e9 B/s), 8,822,848,512 B of bf16 each. Splits with whole GPUs for 64 prompts: T = 1, 2, 4; at T = 1
    the one rank holds 70.9 GiB, over --gpu-gib 60, so it is left out.
      T=2, R=6: 1024/6 + 8 x P x 1.024e6 / 1e15 + 2 x P x 1.024e6 / 1e15 + 6 x 8.8228 s = 264.79 s
      T=4, R=4: 1024/4 + the trainer's half of that                       + 4 x 8.8228 s = 311.89 s"""
    given = dict(decode_tps=1000, seq_tps=1e6, response_tokens=1000, prompt_tokens=0, turns=0, mfu=0.5,
                 peak_flops=1e15, loopback_gbps=8)  # fmt: skip
    _, c = cluster_plan(recipe(), gpus=8, gpu_gib=60, arch=QWEN3_4B, given=given)
    tokens, copy_s = 1024 * 1000, (PARAMS + EMBEDDING) * 2 / 1e9

    def total(trainers: int) -> float:
        rollout_gpus = 8 - trainers
        return 1024 / rollout_gpus + 10 * PARAMS * tokens / (trainers * 5e14) + rollout_gpus * copy_s

    assert (total(2), total(4)) == pytest.approx((264.79, 311.89), abs=0.01)
    assert (c.split.trainer_gpus, c.split.rollout_gpus, c.split.servers) == (2, 6, 6)
    assert c.step.total_s == pytest.approx(total(2))
    assert [r["trainer_gpus"] for r in c.runners_up] == [4]
    assert c.runners_up[0]["total_s"] == pytest.approx(total(4))
    assert c.refused == {
        "rl.prompts_per_step=64 and rl.mini_batch_size=256 do not divide over them": [7, 6, 5, 3],
        "a training rank needs more than --gpu-gib 60": [1],
    }


def test_colocated_uses_every_gpu_and_sends_nothing_over_a_socket():
    _, c = cluster_plan(recipe("rollout.vllm.placement=colocated"), gpus=16, arch=QWEN3_4B)
    assert (c.split.trainer_gpus, c.split.servers, c.sync.receivers, c.sync.bytes_per_step) == (16, 16, 0, 0)
    assert (c.sync.sending_nodes, c.sync.busiest_link_bytes) == (0, 0)
    assert c.sync.gather_link_bytes == PARAMS * 4 // 2  # 2 training nodes; the tied embedding goes once
    assert c.step.detail["in_flight_per_server"] == 1024 / 16


@pytest.mark.parametrize(
    ("overrides", "kw", "message"),
    [
        ((), dict(gpus=8, rollout_gpus=8), "--rollout-gpus 8 must be between 1 and --gpus - 1 = 7"),
        ((), dict(gpus=8, rollout_gpus=3, tp=2), "--rollout-gpus 3 is not a whole number of tp-2 vLLM servers"),
        ((), dict(gpus=8, rollout_gpus=1, tp=2), "--rollout-gpus 1 is not a whole number of tp-2"),
        ((), dict(gpus=8, tp=3), "--vllm-tp 3: one of"),
        ((), dict(gpus=1), "needs --gpus 2 or more"),
        ((), dict(gpus=8, rollout_gpus=3), "--rollout-gpus 3 leaves 5 training GPUs, and rl.prompts_per_step=64"),
        (("rollout.engine=torch",), dict(gpus=8), "rollout.engine=vllm\\), not rollout.engine=torch"),
        (("rollout.vllm.placement=colocated",), dict(gpus=8, rollout_gpus=2), "every GPU trains and rolls out"),
        ((), dict(gpus=8, gpu_gib=30), "no split of 8 GPUs runs this config: .*do not divide over them \\(training "
         "GPUs: 3, 5-7\\); a training rank needs more than --gpu-gib 30 \\(training GPUs: 1-2, 4\\)"),
        (("rl.prompts_per_step=48", "rl.mini_batch_size=192"), dict(gpus=10, tp=4),
         "a tp-4 server would straddle two nodes \\(training GPUs: 2, 6\\)"),
        ((), dict(gpus=8, gpu_gib=1), "no tensor parallel size up to one node fits"),
        ((), dict(gpus=8, given={"mfu": 1.5}), "--mfu=1.5 must be a finite number with 0 < --mfu <= 1"),
    ],
)  # fmt: skip
def test_impossible_runs_are_refused_with_the_reason(overrides, kw, message):
    with pytest.raises(PlanError, match=message):
        cluster_plan(recipe(*overrides), arch=QWEN3_4B, **kw)


def test_a_given_split_whose_rank_does_not_fit_is_planned_and_marked():
    memory, c = cluster_plan(recipe(), gpus=8, rollout_gpus=6, gpu_gib=45, arch=QWEN3_4B)
    assert not c.split.fits and not memory.fits and memory.total_gib > 45 and memory.processes == 2


def test_default_tp_is_the_smallest_that_fits():
    """bf16 Qwen3-4B is 7.49 GiB; at 10 GiB and --gpu-memory-utilization=0.75 one GPU keeps 0.01 GiB of KV cache,
    less than one 23,040-token sequence (3.16 GiB); two GPUs keep 3.75 GiB each for half of it."""
    cfg = recipe()
    _, hf = load_arch("", QWEN3_4B)
    assert default_tp(cfg, hf, PARAMS, 80, 8) == 1
    assert default_tp(cfg, hf, PARAMS, 10, 8) == 2
    with pytest.raises(PlanError, match="--gpus-per-node 1 holds no server|no tensor parallel size"):
        default_tp(cfg, hf, PARAMS, 10, 1)


def test_spans_shortens_runs():
    assert spans([7, 6, 5, 3, 1, 9, 10]) == "1, 3, 5-7, 9-10"


def test_cli_prints_every_section_and_json_keys(capsys):
    from tirl.cli import main

    argv = [
        "plan",
        "--config",
        str(CONFIGS / "recipe-qwen3-4b-grpo-tcr.yaml"),
        "--arch",
        QWEN3_4B,
        "--gpus",
        "32",
    ]
    assert main([*argv, "--link-gbps", "25"]) == 0
    out = capsys.readouterr().out
    for line in (
        "split: ",
        "weight sync per step (as rollout.vllm.sync=memory streams it):",
        "each trainer machine streams its share of the servers: ",
        "step time (synchronous loop",
        "overlapped",
        "assumptions",
    ):
        assert line in out
    assert "--link-gbps        25         given" in out and "25 Gb/s: " in out
    assert main([*argv, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["params"] == PARAMS and data["processes"] == data["cluster"]["split"]["trainer_gpus"]
    assert set(data["cluster"]) == {"gpus", "gpus_per_node", "gpu", "placement", "split", "chosen_by",
                                    "runners_up", "sync", "step", "assumptions", "refused"}  # fmt: skip
    assert set(data["cluster"]["sync"]["seconds"]) == {"25", "100", "400"}
    assert {"busiest_link_bytes", "sending_nodes", "local_receivers"} <= set(data["cluster"]["sync"])
    assert math.isclose(sum(data["cluster"]["step"]["shares"].values()), 1.0)


def test_cli_errors_name_the_problem(capsys):
    from tirl.cli import main

    argv = ["plan", "--config", str(CONFIGS / "recipe-qwen3-4b-grpo-tcr.yaml"), "--arch", QWEN3_4B]
    assert main([*argv, "--rollout-gpus", "4"]) == 2
    assert "--rollout-gpus size(s) a run over a cluster: give --gpus N too" in capsys.readouterr().err
    assert main([*argv, "--gpus", "8", "--nproc", "4"]) == 2
    assert "--nproc with --gpus" in capsys.readouterr().err
    assert main([*argv, "--gpus", "8", "--stage", "sft"]) == 2
    assert "--gpus sizes an RL run" in capsys.readouterr().err
    assert main([*argv, "--gpus", "8", "--rollout-gpus", "6", "--gpu-gib", "45"]) == 3
    assert "DOES NOT FIT" in capsys.readouterr().out
