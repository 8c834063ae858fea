"""What a run needs when it loses a node: its per-rank sampling state dealt out onto another number of processes
(`tirl.train.rl.reshard`: every group lands on the rank that owns its prompt under the new split, none lost, none
twice; what cannot be merged is an error), and a collective timeout that bounds the wait for a vanished machine.
The end-to-end proof (a two-node streaming run, one node killed, resumed on two and on one process) is
tests/rollout/test_multinode.py."""

from __future__ import annotations

import pytest

from tirl.train import dist
from tirl.train.manifest import CheckpointError
from tirl.train.rl.reshard import global_index, owner, reshard_pending, reshard_stream
from tirl.train.rl.stream import FinishedGroup, GroupWork

PROMPTS = 12  # per round, divisible by every world below


def work(rnd: int, local: int, prompt: int) -> GroupWork:
    return GroupWork(rnd, local, row=f"prompt-{rnd}-{prompt}", seeds=(rnd * 100 + prompt,))


def states(world: int) -> list[dict]:
    """Each rank's stream state: round 0 trained, round 1 half finished and half in flight, round 2 queued."""
    out = []
    for r in range(world):
        mine = list(range(r, PROMPTS, world))  # rank_share: every world-th prompt from r on
        out.append(
            {
                "version": 7,
                "rounds": 3,
                "dropped_total": r + 1,
                "trained_groups": [(0, i) for i, _ in enumerate(mine)],
                "ready": [
                    FinishedGroup(work(1, i, p), [f"t{p}"], [p]) for i, p in enumerate(mine) if p % 2 == 0
                ],
                "unfinished": [work(1, i, p) for i, p in enumerate(mine) if p % 2]
                + [work(2, i, p) for i, p in enumerate(mine)],
            }
        )
    return out


def prompts_of(state: dict, world: int, rank: int) -> dict[str, set]:
    """(round, prompt) of every group in the state, read from the group itself (its row names the prompt)."""

    def of(w: GroupWork) -> tuple[int, int]:
        rnd, p = map(int, w.row.split("-")[1:])
        assert (rnd, global_index(rank, w.index, world)) == (rnd, p)  # its new local number is right
        return rnd, p

    return {
        "trained": {(rnd, global_index(rank, i, world)) for rnd, i in state["trained_groups"]},
        "ready": {of(g.work) for g in state["ready"]},
        "unfinished": {of(w) for w in state["unfinished"]},
    }


@pytest.mark.parametrize(("old", "new"), [(2, 1), (1, 2), (2, 3), (3, 2), (2, 4), (4, 3), (2, 2)])
def test_every_group_moves_to_the_rank_that_owns_its_prompt(old, new):
    saved = states(old)
    merged = {"trained": [], "ready": [], "unfinished": []}
    for rank in range(new):
        s = reshard_stream(saved, new, rank)
        assert s["version"] == 7 and s["rounds"] == 3
        assert s["dropped_total"] == (sum(range(1, old + 1)) if rank == 0 else 0)
        got = prompts_of(s, new, rank)
        for entry, keys in got.items():
            assert all(owner(p, new)[0] == rank for _, p in keys)
            merged[entry] += sorted(keys)
        assert [g.work.key for g in s["ready"]] == sorted(g.work.key for g in s["ready"])
    assert sorted(merged["trained"]) == [(0, p) for p in range(PROMPTS)]
    assert sorted(merged["ready"]) == [(1, p) for p in range(0, PROMPTS, 2)]
    assert sorted(merged["unfinished"]) == sorted(
        [(1, p) for p in range(1, PROMPTS, 2)] + [(2, p) for p in range(PROMPTS)]
    )
    for entry, keys in merged.items():
        assert len(keys) == len(set(keys)), entry


def test_the_split_matches_the_one_the_trainer_uses(monkeypatch):
    for world in (1, 2, 3, 4):
        for rank in range(world):
            monkeypatch.setattr(dist, "world_size", lambda w=world: w)
            monkeypatch.setattr(dist, "rank", lambda r=rank: r)
            share = dist.rank_share(list(range(PROMPTS)))
            assert [global_index(rank, i, world) for i in range(len(share))] == share
            assert all(owner(p, world) == (rank, i) for i, p in enumerate(share))


def test_ranks_that_disagree_are_refused():
    saved = states(2)
    saved[1]["version"] = 8
    with pytest.raises(CheckpointError, match="disagree on the stream's weight version"):
        reshard_stream(saved, 1, 0)


def test_the_batch_sampled_ahead_is_dealt_out_by_group():
    n = 2
    pendings = []
    for r in range(2):
        mine = list(range(r, PROMPTS, 2))
        trajs = [f"p{p}-{k}" for p in mine for k in range(n)]
        pendings.append((trajs, [p for p in mine for _ in range(n)], {"x": 1.0}))
    got = [reshard_pending(pendings, n, 3, rank) for rank in range(3)]
    for rank, (trajs, scores, stats) in enumerate(got):
        mine = list(range(rank, PROMPTS, 3))
        assert trajs == [f"p{p}-{k}" for p in mine for k in range(n)] and stats == {}
        assert scores == [p for p in mine for _ in range(n)]
    assert reshard_pending([None, None], n, 1, 0) is None
    with pytest.raises(CheckpointError, match="disagree on whether a batch was sampled ahead"):
        reshard_pending([pendings[0], None], n, 1, 0)


def test_the_collective_timeout_is_the_configured_one(monkeypatch):
    """dist.timeout_s bounds how long a rank waits for a machine that vanished without closing its sockets."""
    import torch.distributed as tdist

    from tirl.train.config import DistConfig

    seen = {}
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setattr(tdist, "init_process_group", lambda **kw: seen.update(kw))
    monkeypatch.setattr(dist, "is_distributed", lambda: False)
    monkeypatch.setattr(dist, "rank", lambda: 0)
    dist.init_distributed(DistConfig(backend="gloo", timeout_s=42.5), "cpu")
    assert seen["backend"] == "gloo" and seen["timeout"].total_seconds() == 42.5
    with pytest.raises(ValueError, match="dist.timeout_s"):
        DistConfig(timeout_s=float("inf"))


def test_a_collective_that_lost_its_peer_is_named(monkeypatch):
    """gloo's and NCCL's words for a rank that is gone become one error naming it (the CLI prints it in one line);
    any other failure is left as it is, and in one process nothing is a lost peer."""
    gloo = RuntimeError(
        "[gloo/transport/tcp/pair.cc:553] Connection closed by peer [10.0.0.2]:49853. This is ..."
    )
    monkeypatch.setattr(dist, "is_distributed", lambda: False)
    assert dist.lost_peer(gloo) is None
    monkeypatch.setattr(dist, "is_distributed", lambda: True)
    assert dist.lost_peer(gloo).startswith("[gloo/transport/tcp/pair.cc:553] Connection closed by peer")
    assert dist.lost_peer(RuntimeError("NCCL communicator was aborted on rank 3")) is not None
    assert dist.lost_peer(ValueError("rl.n must be > 0")) is None
    assert dist.lost_peer(RuntimeError("CUDA out of memory")) is None


def test_a_lost_rank_exits_without_waiting_for_blocked_threads():
    """After another rank died, threads of this process may be blocked on it (or on servers stopping with it): the
    CLI prints the one line and exits 2 at once instead of waiting for them (a plain exit would wait 60 s here)."""
    import subprocess
    import sys
    import time
    from pathlib import Path

    script = """
import argparse, sys, threading, time
from tirl import cli
from tirl.commands.stage import RankLost
threading.Thread(target=time.sleep, args=(60,)).start()  # not a daemon: a normal exit joins it
def lost(args):
    raise RankLost("rank 0 of 2: a collective failed because another rank is gone (test)")
cli.build_parser = lambda: type("P", (), {"parse_args": lambda self, a: argparse.Namespace(fn=lost, command="rl")})()
sys.exit(cli.main([]))
"""
    src = Path(__file__).resolve().parents[2] / "src"
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=50,
                       env={"PYTHONPATH": str(src), "PATH": "/usr/bin:/bin"})  # fmt: skip
    assert r.returncode == 2 and time.monotonic() - t0 < 30, (r.returncode, r.stderr)
    assert "tirl rl: error: rank 0 of 2: a collective failed because another rank is gone" in r.stderr
