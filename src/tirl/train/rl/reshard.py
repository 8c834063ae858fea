"""Each rank's sampling state moved onto a different number of processes, so a run resumed on more or fewer ranks
(a node lost, a node added) trains every group a checkpoint held once and none twice.

A step's prompts are drawn alike on every rank and split by `tirl.train.dist.rank_share`: rank r of W keeps every
W-th prompt from r on, so its i-th group is the round's prompt r + i·W. The streaming producer's finished and
unfinished groups and its record of trained ones (`rl.stream`), and the batch sampled ahead (`rl.off_policy_steps`),
are kept per rank under those local numbers; here they are renumbered by the round's prompt and dealt out again as
the new world splits them. Pure functions over the checkpoint's per-rank entries; `tirl.train.rl.sampling` calls them
when the checkpoint's `world_size` is not the run's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from tirl.train.manifest import CheckpointError


def global_index(rank: int, local: int, world: int) -> int:
    """The round's prompt that rank `rank` of `world` numbers `local`."""
    return rank + local * world


def owner(index: int, world: int) -> tuple[int, int]:
    """(rank, local number) of the round's prompt `index` in a world of `world` ranks."""
    return index % world, index // world


def _moved(key: tuple[int, int], old_rank: int, old_world: int, world: int) -> tuple[int, tuple[int, int]]:
    """(new rank, new key) of a group's (round, local index) key."""
    rnd, local = key
    rank, new_local = owner(global_index(old_rank, local, old_world), world)
    return rank, (rnd, new_local)


def reshard_stream(states: Sequence[dict[str, Any]], world: int, rank: int) -> dict[str, Any]:
    """Rank `rank` of `world`'s producer state (`Streaming.state_dict()["stream"]`) from the states every rank of the
    saving run wrote (`states[r]`: rank r's, of `len(states)`). The finished groups keep their versions (every rank
    saved them against one engine counter); the dropped count goes to rank 0, so the sum over ranks is kept."""
    old_world = len(states)
    versions = {int(s["version"]) for s in states}
    rounds = {int(s["rounds"]) for s in states}
    if len(versions) != 1 or len(rounds) != 1:
        raise CheckpointError(
            f"the checkpoint's ranks disagree on the stream's weight version {sorted(versions)} or rounds "
            f"{sorted(rounds)}; it cannot be resumed on {world} processes"
        )
    ready, unfinished, trained = [], [], []
    for r, s in enumerate(states):
        for group in s["ready"]:
            to, key = _moved(group.work.key, r, old_world, world)
            if to == rank:
                work = dataclasses.replace(group.work, index=key[1])
                ready.append(dataclasses.replace(group, work=work))
        for work in s["unfinished"]:
            to, key = _moved(work.key, r, old_world, world)
            if to == rank:
                unfinished.append(dataclasses.replace(work, index=key[1]))
        for key in s["trained_groups"]:
            to, new = _moved(tuple(key), r, old_world, world)
            if to == rank:
                trained.append(new)
    return {
        "version": versions.pop(),
        "ready": sorted(ready, key=lambda g: g.work.key),
        "unfinished": sorted(unfinished, key=lambda w: w.key),
        "dropped_total": sum(int(s.get("dropped_total", 0)) for s in states) if rank == 0 else 0,
        "rounds": rounds.pop(),
        "trained_groups": sorted(trained),
    }


def reshard_pending(pendings: Sequence[Any], n: int, world: int, rank: int) -> Any:
    """Rank `rank` of `world`'s batch sampled ahead (`Ahead.state_dict()["pending"]`: (trajectories, scores,
    stats), `n` trajectories per group in the rank's group order, or None) from every saving rank's; None when no
    rank had one."""
    if all(p is None for p in pendings):
        return None
    if any(p is None for p in pendings):
        raise CheckpointError("the checkpoint's ranks disagree on whether a batch was sampled ahead")
    old_world, mine = len(pendings), []
    for r, (trajs, scores, _stats) in enumerate(pendings):
        for local in range(len(trajs) // n):
            to, new_local = owner(global_index(r, local, old_world), world)
            if to == rank:
                part = slice(local * n, (local + 1) * n)
                mine.append((new_local, trajs[part], scores[part]))
    mine.sort(key=lambda m: m[0])
    return (
        [t for _, ts, _ in mine for t in ts],
        [s for _, _, ss in mine for s in ss],
        {},
    )
