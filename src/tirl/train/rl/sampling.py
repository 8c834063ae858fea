"""How an RL step gets its batch: one class per sampling mode, chosen once from `rl.*` (`sampling_mode`).

- `Synchronous` (the default): the step's prompts rolled out when the step starts, from the weights it starts with.
- `Dynamic` (`rl.dynamic_sampling`, DAPO): as `Synchronous`, then only the groups with a reward signal, refilled
  from new prompts for up to `rl.dynamic_max_rounds` extra rounds.
- `Ahead` (`rl.off_policy_steps: 1`, `tirl.train.rl.overlap`): the next step's batch sampled in the background
  while this step updates.
- `Streaming` (`rl.stream.enabled`, `tirl.train.rl.stream`): groups sampled continuously by a producer, a batch
  taken within the staleness bound.

Every mode draws its prompts from one `PromptOrder` and rolls them out through one `Rollouts` (the run's agent,
sampling and reward, with the trainer's generator), so a mode decides only when a batch is sampled and with which
draws. The trainer asks its mode for each step's batch (`batch`), tells it before each weight sync (`before_sync`),
closes it when the steps end, and checkpoints its state (`state_dict`, `load_state_dict`; each rank's own entries
named in `rank_state`). `RLConfig` refuses any two of the last three together.

Not here: the update and its old log-probs (`tirl.train.rl.trainer`), the producer's threads and buffer
(`tirl.train.rl.stream`), which engine may sample ahead or stream (`tirl.train.rl.check`).
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from tirl.core.logging import console
from tirl.data.records import ProblemRow
from tirl.rewards.scoring import Score
from tirl.rollout.agent.async_loop import draw_seeds
from tirl.rollout.agent.episodes import rollout_and_score
from tirl.rollout.factory import awake
from tirl.rollout.types import Trajectory
from tirl.train import checkpoint_read, dist, fsdp
from tirl.train.perf import Timers
from tirl.train.rl.batch import groups_with_signal, rank_reduced
from tirl.train.rl.check import why_not_stream
from tirl.train.rl.config import RLConfig
from tirl.train.rl.overlap import Lookahead, staleness_metrics
from tirl.train.rl.reshard import reshard_pending, reshard_stream
from tirl.train.rl.run import RLRun
from tirl.train.rl.stream import GroupWork, StreamProducer, flatten


@dataclass
class Sampled:
    """A step's batch: its trajectories, their scores and what the mode logs about it."""

    trajs: list[Trajectory]
    scores: list[Score]
    # the mode's own (dynamic/*, stream/*), over all ranks
    metrics: dict[str, float] = field(default_factory=dict)
    # rollout/staleness*, this rank's; none for a mode that samples from the step's own weights
    staleness: dict[str, float] = field(default_factory=dict)


class PromptOrder:
    """Epoch-wise shuffled prompts: each row is used once before any is reused. Every rank draws the same step's
    prompts (one order, seeded alike) and keeps its own share."""

    def __init__(self, rows: Sequence[ProblemRow], per_step: int, seed: int) -> None:
        self.rows, self.per_step = rows, per_step
        self.order: list[int] = []  # the epoch's rows not yet drawn, drawn from the end
        self.rng = random.Random(seed)

    def next(self) -> list[ProblemRow]:
        """This rank's share of the next step's prompts."""
        out = []
        while len(out) < self.per_step:
            if not self.order:
                self.order = list(range(len(self.rows)))
                self.rng.shuffle(self.order)
            out.append(self.rows[self.order.pop()])
        return dist.rank_share(out)


class Rollouts:
    """`n` scored trajectories per prompt through the run's agent, drawn with the trainer's generator (`gen`, which
    also orders its mini-batches) and timed in its `timers`; the prompts every mode draws (`prompts`)."""

    def __init__(self, run: RLRun, gen: torch.Generator, timers: Timers) -> None:
        self.run, self.gen, self.timers = run, gen, timers
        self.prompts = PromptOrder(run.rows, run.cfg.prompts_per_step, run.seed)

    def sample(
        self, rows: Sequence[ProblemRow], first_group: int, *, step: int, gen: torch.Generator | None = None
    ) -> tuple[list[Trajectory], list[Score]]:
        """`n` trajectories per row, scored; their groups number the rows from `first_group` on; an error names
        `step`, the step sampling them."""
        run = self.run
        run.policy.eval()
        return rollout_and_score(
            run.agent,
            rows,
            run.sampling,
            n=run.cfg.n,
            reward=run.reward,
            generator=self.gen if gen is None else gen,
            first_group=first_group,
            where=f"RL step {step}",
            timed=self.timers.time,
            sampling_context=self._context,
        )

    def _context(self) -> contextlib.ExitStack:
        """The whole model on each rank (an engine sharing the policy) and the engine awake: a colocated engine
        sleeps outside the rollouts, the torch engine drops what it keeps for them (packed weights, kept KV)."""
        stack = contextlib.ExitStack()
        if self.run.engine_caps.shares_policy:
            stack.enter_context(fsdp.gathered(self.run.policy))
        stack.enter_context(awake(self.run.agent.engine))
        return stack


def own_entry(state: dict[str, Any], key: str, reshard: Any, what: str) -> Any:
    """This rank's entry `key` of a checkpoint's per-rank sampling state; when the checkpoint's run had another
    number of processes, every saving rank's entries dealt out onto this run's (`reshard(saved, world, rank)`,
    `tirl.train.rl.reshard`)."""
    saved = checkpoint_read.saved_world(state)
    if saved in (None, dist.world_size()):
        return state.get(key)
    mine = reshard(checkpoint_read.every_rank(state, key), dist.world_size(), dist.rank())
    if dist.is_main():
        console.print(f"{what}: dealt out from {saved} processes onto {dist.world_size()}")
    return mine


class SamplingMode:
    """What the trainer asks of a sampling mode; the hooks are no-ops here."""

    rank_state: tuple[str, ...] = ()  # state_dict's entries each rank has its own of
    # the rollouts come from the weights the step starts with (never sampled ahead of the last sync)
    fresh = True

    def __init__(self, rollouts: Rollouts, cfg: RLConfig) -> None:
        self.rollouts, self.cfg = rollouts, cfg

    def batch(self, step: int) -> Sampled:
        """Step `step`'s trajectories."""
        raise NotImplementedError

    def before_sync(self) -> None:
        """Called before the engine loads the updated weights."""

    def close(self) -> None:
        """Called when the steps end, however they end."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """`state`: the trainer's whole checkpointed state, the weights already restored and synced."""


class Synchronous(SamplingMode):
    """The step's prompts rolled out when the step starts, from the weights it starts with."""

    def batch(self, step: int) -> Sampled:
        rows = self.rollouts.prompts.next()
        first_group = dist.rank() * len(rows)  # group numbers unique over ranks
        return Sampled(*self.rollouts.sample(rows, first_group, step=step))


class Dynamic(Synchronous):
    """DAPO's dynamic sampling (`rl.dynamic_sampling`): only groups with a reward signal, refilled from new prompts
    for up to `rl.dynamic_max_rounds` extra rounds, trimmed to `rl.prompts_per_step` groups; every group drawn if
    none has a signal (nothing to learn from the step). `dynamic/*` counts the rounds and the groups."""

    def batch(self, step: int) -> Sampled:
        cfg, want = self.cfg, self.cfg.prompts_per_step * self.cfg.n
        first = super().batch(step)
        drawn_t, drawn_s, rounds = list(first.trajs), list(first.scores), 0
        keep_t, keep_s = groups_with_signal(first.trajs, first.scores)
        while len(keep_t) < want and rounds < cfg.dynamic_max_rounds:
            rounds += 1
            rows = self.rollouts.prompts.next()
            more_t, more_s = self.rollouts.sample(rows, rounds * cfg.prompts_per_step, step=step)
            drawn_t += more_t
            drawn_s += more_s
            t, sc = groups_with_signal(more_t, more_s)
            keep_t, keep_s = keep_t + t, keep_s + sc
        keep_t, keep_s = keep_t[:want], keep_s[:want]
        stats = {
            "dynamic/rounds": float(rounds),
            "dynamic/groups_drawn": float(len(drawn_t) // cfg.n),
            "dynamic/groups_kept": float(len(keep_t) // cfg.n),
        }
        if not keep_t:
            return Sampled(drawn_t, drawn_s, stats)
        return Sampled(keep_t, keep_s, stats)


class Ahead(Synchronous):
    """`rl.off_policy_steps: 1` (`tirl.train.rl.overlap`): step 0 samples its own batch; every step then starts
    sampling the next one in the background, from the weights the engine serves now, before its update. The batch
    sampled ahead is waited for before the sync and checkpointed with the step (`pending`)."""

    rank_state = ("pending",)
    fresh = False

    def __init__(self, rollouts: Rollouts, cfg: RLConfig) -> None:
        super().__init__(rollouts, cfg)
        self.ahead = Lookahead()

    def batch(self, step: int) -> Sampled:
        pending = self.ahead.take()
        sampled = Sampled(*pending) if pending else super().batch(step)
        sampled.staleness = staleness_metrics(sampled.trajs, self.rollouts.run.agent.engine.weight_version)
        if step + 1 < self.cfg.steps:
            self._start(step)
        return sampled

    def _start(self, step: int) -> None:
        """Start sampling the next step's batch; its prompts and seed are drawn here, in the main thread."""
        rows = self.rollouts.prompts.next()
        gen = torch.Generator().manual_seed(int(torch.randint(2**62, (1,), generator=self.rollouts.gen)))
        first = dist.rank() * len(rows)
        self.ahead.start(lambda: (*self.rollouts.sample(rows, first, step=step, gen=gen), {}))

    def before_sync(self) -> None:
        """The next batch's requests end before the engine reloads its weights."""
        self.ahead.wait()

    def state_dict(self) -> dict[str, Any]:
        return {"pending": self.ahead.pending}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The batch sampled during the checkpointed step's update (dealt out again when the checkpoint's run had
        another number of processes)."""
        n = self.cfg.n
        self.ahead.pending = own_entry(
            state,
            "pending",
            lambda saved, world, rank: reshard_pending(saved, n, world, rank),
            "the batch sampled ahead",
        )


class Streaming(SamplingMode):
    """`rl.stream.enabled` (`tirl.train.rl.stream`): the producer samples rounds of prompts continuously; a step
    submits the rounds up to itself + `rl.stream.max_staleness` and takes the first finished groups within the
    bound, numbered as a synchronous step numbers them. `trained_groups`: (round, index) of every group trained."""

    rank_state = ("stream",)

    def __init__(self, rollouts: Rollouts, cfg: RLConfig, producer: StreamProducer) -> None:
        super().__init__(rollouts, cfg)
        self.producer = producer
        self.fresh = cfg.stream.max_staleness == 0
        self.rounds = 0  # rounds of prompts handed to the producer
        self.trained_groups: list[tuple[int, int]] = []

    def batch(self, step: int) -> Sampled:
        run = self.rollouts.run
        while self.rounds <= step + self.cfg.stream.max_staleness:
            self._submit_round()
        local = len(dist.rank_share(list(range(self.cfg.prompts_per_step))))
        with self.rollouts.timers.time("rollout"):
            groups, stats = self.producer.take(local, run.agent.engine.weight_version, self._submit_round)
        self.trained_groups += [g.work.key for g in groups]
        if run.engine_caps.sync_gate:  # such an engine has its gate (tirl.rollout.engines.base)
            stats["stream/interrupted_requests"] = float(run.agent.engine.gate.interruptions)
        trajs, scores = flatten(groups, dist.rank() * local)
        return Sampled(
            trajs, scores, rank_reduced(stats), staleness_metrics(trajs, run.agent.engine.weight_version)
        )

    def _submit_round(self) -> None:
        """Hand the producer a step's worth of prompts, each trajectory's request seed drawn as a synchronous step
        draws them."""
        rows, n = self.rollouts.prompts.next(), self.cfg.n
        seeds = draw_seeds(len(rows) * n, self.rollouts.gen)
        works = [GroupWork(self.rounds, i, r, tuple(seeds[i * n : (i + 1) * n])) for i, r in enumerate(rows)]
        self.producer.submit(works)
        self.rounds += 1

    def close(self) -> None:
        self.producer.close()

    def state_dict(self) -> dict[str, Any]:
        """The producer's buffer and unfinished work (`StreamProducer.snapshot`), with the rounds drawn so far."""
        snap = self.producer.snapshot(self.rollouts.run.agent.engine.weight_version)
        return {"stream": snap | {"rounds": self.rounds, "trained_groups": list(self.trained_groups)}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The checkpoint's groups keep their age on the engine's counter; a checkpoint of another number of
        processes has every rank's groups dealt out again (`tirl.train.rl.reshard`)."""
        stream = own_entry(state, "stream", reshard_stream, "the stream's groups")
        if stream is not None:
            self.rounds = int(stream["rounds"])
            self.trained_groups = list(stream["trained_groups"])
            self.producer.restore(stream, self.rollouts.run.agent.engine.weight_version)


def stream_producer(run: RLRun) -> StreamProducer:
    """The producer of `rl.stream.*`, for an engine that can stream (checked again on the engine built:
    `rollout.engine=vllm` may be colocated)."""
    s, n = run.cfg.stream, run.cfg.n
    if why := why_not_stream(run.engine_caps, partial=s.partial):
        raise ValueError(why)
    capacity = s.capacity(run.cfg.prompts_per_step // dist.world_size())
    return StreamProducer(
        run.agent,
        run.sampling,
        run.reward,
        n=n,
        capacity=capacity,
        max_staleness=s.max_staleness,
        partial=s.partial,
        workers=max(1, min(capacity, getattr(run.agent, "concurrency", 1) // n)),
    )


def sampling_mode(run: RLRun, gen: torch.Generator, timers: Timers) -> SamplingMode:
    """The mode `run.cfg` names, sampling through `Rollouts` of `run` with the trainer's `gen` and `timers`."""
    rollouts, cfg = Rollouts(run, gen, timers), run.cfg
    if cfg.stream.enabled:
        return Streaming(rollouts, cfg, stream_producer(run))
    if cfg.off_policy_steps:
        return Ahead(rollouts, cfg)
    if cfg.dynamic_sampling:
        return Dynamic(rollouts, cfg)
    return Synchronous(rollouts, cfg)
