"""Streaming RL (`rl.stream.*`): GRPO groups are sampled continuously while the trainer updates, and a step takes
its batch as soon as enough finished groups are ready.

AReaL, verl's fully async trainer, SkyRL and prime-rl all do this; this is the bounded, one-process version:

1. The trainer's streaming mode (`tirl.train.rl.sampling.Streaming`) draws work in *rounds*: a step's prompts and
   every trajectory's request seed (the draws the async agent loop makes for a synchronous step), in the main
   thread, in step order. At step s the rounds up to s + K are submitted (K = `rl.stream.max_staleness`), more
   only when too few groups are left to fill a batch (dropped ones are replaced).
2. `StreamProducer` runs the work on its own threads, a group at a time (`n` trajectories of one prompt through
   the async agent loop, then graded), at most `buffer_groups` groups finished or in flight: memory stays bounded
   and the engine is never asked for more than that.
3. `take` hands the trainer `count` finished groups in the order they finished, dropping (and counting) those whose
   oldest token is more than K updates older than the weights the engine serves now; the batch is ordered by
   (round, index) and its groups renumbered, so the advantages see the same group ids a synchronous step would.
4. The weight sync after the update does not wait for the producer: the engine's gate
   (`tirl.rollout.engines.gate`) lets the requests in flight end first (each a turn), or with partial rollouts
   (`rl.stream.partial`) interrupts them and continues them from their tokens with the new weights.

Exactness. With K = 0 the producer has nothing to run until the step's round is submitted, after the previous
sync, so a step samples exactly the synchronous step's trajectories (same prompts, same seeds, nothing in flight
at a sync) and the run equals the synchronous loop to the bit (tests/train/test_stream.py). With K >= 1 the run is
deterministic given the order in which groups finish and the points at which syncs meet requests; timing changes
which groups make a batch, how stale they are, which are dropped, and with partial rollouts where a turn's versions
change.

Resume. A checkpoint keeps the producer's finished groups (with their versions, rebased on the engine's counter
when restored) and the work not yet finished (queued or in flight), which a resumed run samples again from its
seeds, with the resumed weights; a group is taken once, so no trajectory is trained twice, and none is lost.
Not here: which engine may stream (`tirl.train.rl.check.why_not_stream`).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tirl.data.records import ProblemRow
from tirl.rewards.scoring import Score
from tirl.rewards.shaping import RewardConfig
from tirl.rollout.agent.episodes import rollout_and_score
from tirl.rollout.agent.loop import AgentLoop
from tirl.rollout.factory import awake
from tirl.rollout.sampling import SamplingParams
from tirl.rollout.types import Trajectory


@dataclass(frozen=True)
class GroupWork:
    """One GRPO group to sample: the `index`-th prompt of round `round`, with one request seed per trajectory."""

    round: int
    index: int
    row: ProblemRow
    seeds: tuple[int, ...]

    @property
    def key(self) -> tuple[int, int]:
        return (self.round, self.index)


@dataclass
class FinishedGroup:
    """A sampled and graded group; `version` is the oldest policy version that sampled any of its tokens."""

    work: GroupWork
    trajs: list[Trajectory]
    scores: list[Score]

    @property
    def version(self) -> int:
        versions = [
            v
            for t in self.trajs
            for v, m in zip(t.token_versions or t.turn_token_versions() or [], t.loss_mask, strict=False)
            if m
        ]
        return min(versions, default=0)

    def shift(self, by: int) -> None:
        """Every version moved by `by`: the group restored against an engine whose counter started elsewhere."""
        for t in self.trajs:
            t.weight_versions = [v + by for v in t.weight_versions]
            t.token_versions = [v + by if v >= 0 else v for v in t.token_versions]


class GroupFailed(RuntimeError):
    """A group's rollout raised; the run stops as a synchronous step would (its work stays unfinished)."""


class StreamProducer:
    """The producer threads and the bounded buffer of finished groups (module docstring)."""

    def __init__(
        self,
        agent: AgentLoop,
        sampling: SamplingParams,
        reward: RewardConfig,
        *,
        n: int,
        capacity: int,
        max_staleness: int,
        workers: int,
        partial: bool = False,
    ) -> None:
        if capacity < 1 or workers < 1 or max_staleness < 0:
            raise ValueError(f"capacity and workers must be >= 1, max_staleness >= 0: {capacity}, {workers}")
        self.agent, self.sampling, self.reward, self.n = agent, sampling, reward, n
        self.capacity, self.max_staleness, self.workers, self.partial = (
            capacity,
            max_staleness,
            workers,
            partial,
        )
        self._cond = threading.Condition()
        self._queue: deque[GroupWork] = deque()
        self._running: dict[tuple[int, int], GroupWork] = {}
        self._ready: deque[FinishedGroup] = deque()
        self._error: GroupFailed | None = None
        self._threads: list[threading.Thread] = []
        self._awake = contextlib.ExitStack()
        self._closing = False
        self.dropped_total = 0

    # ---- the producer's side ----------------------------------------------------------------------------------

    def submit(self, works: Sequence[GroupWork]) -> None:
        """Queue groups to sample (in this order); starts the threads on first use."""
        with self._cond:
            self._queue.extend(works)
            self._cond.notify_all()
        if not self._threads:
            self._awake.enter_context(awake(self.agent.engine))  # a paused server runs while anything streams
            if self.partial:
                self.agent.engine.gate.interrupt = True  # checked: the engine can (EngineCapabilities)
            for _ in range(self.workers):
                th = threading.Thread(target=self._worker, daemon=True, name="tirl-stream")
                th.start()
                self._threads.append(th)

    def _next_work(self) -> GroupWork | None:
        with self._cond:
            while not self._closing and self._error is None and not self._room():
                self._cond.wait()
            if self._closing or self._error is not None:
                return None
            work = self._queue.popleft()
            self._running[work.key] = work
            return work

    def _room(self) -> bool:
        return bool(self._queue) and len(self._running) + len(self._ready) < self.capacity

    def _worker(self) -> None:
        while (work := self._next_work()) is not None:
            try:
                trajs, scores = rollout_and_score(
                    self.agent,
                    [work.row],
                    self.sampling,
                    n=self.n,
                    reward=self.reward,
                    generator=None,
                    where=f"streamed group {work.key}",
                    first_group=work.index,
                    seeds=list(work.seeds),
                )
            except BaseException as e:  # noqa: BLE001 - re-raised in the trainer's thread by `take`
                with self._cond:
                    if not self._closing and self._error is None:
                        self._error = GroupFailed(f"streamed rollout of group {work.key} failed: {e}")
                        self._error.__cause__ = e
                    self._cond.notify_all()
                return
            with self._cond:
                self._running.pop(work.key, None)
                if not self._closing:
                    self._ready.append(FinishedGroup(work, trajs, scores))
                self._cond.notify_all()

    # ---- the trainer's side -----------------------------------------------------------------------------------

    def take(
        self, count: int, version: int, refill: Callable[[], None]
    ) -> tuple[list[FinishedGroup], dict[str, float]]:
        """`count` finished groups at most `max_staleness` updates older than `version`, in (round, index) order,
        and the step's `stream/*` metrics. Older groups are dropped as they come; `refill()` (which submits a
        round) is called, outside the lock, whenever too few groups are left to fill the batch."""
        t0, taken, dropped = time.monotonic(), [], 0
        while True:
            with self._cond:
                while self._ready and len(taken) < count:
                    group = self._ready.popleft()
                    if version - group.version > self.max_staleness:
                        dropped += 1
                    else:
                        taken.append(group)
                self._cond.notify_all()  # room for the producer
                if len(taken) == count:
                    break
                if (
                    self._error is not None
                ):  # the groups taken go back: a checkpoint or a retry still has them
                    self._ready.extendleft(reversed(taken))
                    raise self._error
                left = len(self._queue) + len(self._running) + len(self._ready)
                if len(taken) + left >= count:
                    self._cond.wait(timeout=1.0)
                    continue
            refill()
        self.dropped_total += dropped
        with self._cond:
            buffered = len(self._ready)
        stats = {
            "stream/dropped_groups": float(dropped),
            "stream/dropped_total": float(self.dropped_total),
            "stream/buffer_groups": float(buffered),
            "stream/idle_s": time.monotonic() - t0,
        }
        return sorted(taken, key=lambda g: g.work.key), stats

    def snapshot(self, version: int) -> dict[str, Any]:
        """What a checkpoint keeps: the finished groups with the engine's version now, and the work not finished
        (in flight first, then queued: the order it was submitted in)."""
        with self._cond:
            unfinished = sorted(self._running.values(), key=lambda w: w.key) + list(self._queue)
            return {
                "version": version,
                "ready": list(self._ready),
                "unfinished": unfinished,
                "dropped_total": self.dropped_total,
            }

    def restore(self, state: dict[str, Any], version: int) -> None:
        """A checkpoint's `snapshot`, against an engine now at `version`: its finished groups keep their age, its
        unfinished work is sampled again first."""
        ready = list(state["ready"])
        for group in ready:
            group.shift(version - int(state["version"]))
        with self._cond:
            self._ready.extend(ready)
            self._queue.extendleft(reversed(state["unfinished"]))
            self.dropped_total = int(state.get("dropped_total", 0))
            self._cond.notify_all()
        if state["unfinished"]:
            self.submit([])

    def close(self) -> None:
        """Stop starting groups; the ones in flight are abandoned (daemon threads, their results discarded)."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self.partial and self._threads:
            self.agent.engine.gate.interrupt = False
        self._awake.close()


def flatten(groups: Sequence[FinishedGroup], first_group: int) -> tuple[list[Trajectory], list[Score]]:
    """The batch's trajectories and scores, group after group, the groups numbered from `first_group`."""
    trajs: list[Trajectory] = []
    scores: list[Score] = []
    for j, g in enumerate(groups):
        for t in g.trajs:
            t.group = first_group + j
        trajs += g.trajs
        scores += g.scores
    return trajs, scores
