"""RL with GRPO-TCR on multi-turn tool rollouts: a readable loop that calls its collaborators.

One step: sample prompts, roll each out `n` times through the agent loop, score them, turn rewards into group
advantages, recompute old log-probs with the policy, then take mini-batch policy-gradient steps.

How this departs from textbook GRPO (the reference recipe's choices unless noted):
1. Token-level loss (`token-mean`): every trained token in a mini-batch weighs the same (the "T"; verl's: token_mean).
2. Clip-higher: asymmetric ratio clip 1-0.2 / 1+0.28 (the "C"), plus dual-clip (c = 10) for negative advantages
   (`rl.loss.*` of the default loss, `ppo`).
3. Overlong reward shaping (DAPO): a soft penalty as the response nears the budget (the "R").
4. No KL penalty and no reference model by default; `rl.kl.coef > 0` turns on a k1/k3 penalty in the loss.
5. Tool-output tokens are in the context but never in the loss (`loss_mask`), and they count toward the budget.
6. A group whose rewards are all equal gets exactly zero advantage (group statistics in float64, equal groups
   detected explicitly); `adv/zero_share` is the share of such groups. No dynamic re-sampling replaces them.
7. Old log-probs: with a single update per step, the detached log-probs of that update's own forward pass (as verl
   does), which also give the engine/trainer mismatch and its correction; with several, the engine's sampling
   log-probs where they are the trainer's own to float rounding (the torch engine in fp32, sampling with the
   step's starting weights: verl's bypass mode), else a no-grad pass of the policy before the first update, which
   also measures the engine/trainer mismatch (`rl.old_logprobs`).
8. `seq-mean-token-sum-norm` divides by a fixed length (`rl.loss.norm_len`, default the response budget), never
   by the padded length of the batch, which would bring back the length bias it exists to remove.
9. An update whose loss or gradient norm is not finite is skipped (parameters, AdamW moments and the schedule
   untouched) and counted in `loss/skipped_updates`; `optim.max_skipped_in_row` in a row stop the run, and so
   does a run whose last update was skipped (no final model) or whose weights went non-finite (checked every step).
10. Groups of one (`n = 1`) are refused: every group-relative estimator gives them zero advantage (verl's GRPO
   instead passes the raw reward through, an unbaselined REINFORCE), so such a run would silently learn nothing.
11. Under torchrun, each rank takes its share of the step's prompts (`dist.rank_share`) and samples all `n`
   rollouts of each, with its own in-process engine or from the shared vLLM servers (seeds from seed and rank):
   groups stay whole on one rank, so advantages need no communication and no token crosses ranks; only loss
   normalizers, gradients and metrics are reduced. The weight sync after each update is collective.
12. Rollouts may run ahead of the update: one step (`rl.off_policy_steps`, `tirl.train.rl.overlap`) or continuously,
   with a staleness bound (`rl.stream.*`, `tirl.train.rl.stream`); the rollout correction covers the stale tokens.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import torch

from tirl.algorithms import get_advantage_estimator, get_policy_loss
from tirl.core.progress import progress
from tirl.data.records import ProblemRow
from tirl.rollout.agent.async_loop import draw_seeds
from tirl.rollout.agent.episodes import rollout_and_score
from tirl.rollout.factory import awake
from tirl.rollout.types import Trajectory
from tirl.train import checkpoint, dist, fsdp, manifest
from tirl.train.batch import TokenBatch, slice_rows
from tirl.train.checkpoint import CheckpointError
from tirl.train.compiled import CompiledLayers
from tirl.train.optim import SkipGuard, build_optimizer, clip_and_step
from tirl.train.perf import Timers, peak_memory_mb
from tirl.train.rl.batch import (
    TRUNCATED,
    global_rollout_metrics,
    groups_with_signal,
    rank_reduced,
    render_samples,
    rollout_logprobs,
    trajectory_batch,
)
from tirl.train.rl.check import why_not_stream
from tirl.train.rl.config import RLConfig
from tirl.train.rl.correction import RolloutCorrection
from tirl.train.rl.overlap import lookahead, staleness_metrics
from tirl.train.rl.run import RLRun
from tirl.train.rl.stream import GroupWork, StreamProducer, flatten
from tirl.train.rl.token_check import token_fidelity
from tirl.train.rl.update import LossSpec, accumulate_gradients, no_grad_logprobs
from tirl.train.signals import graceful_stop


class RLTrainer:
    """The GRPO-TCR loop; checkpointed and resumed through `tirl.train.checkpoint.Resumable`."""

    rank_state: tuple[str, ...] = ("generator",)  # each rank samples and orders mini-batches with its own

    def __init__(self, run: RLRun) -> None:
        """`run`: the policy, engine, prompts and settings, checked and sized (`tirl.train.rl.run.assemble`); the
        trainer adds only the algorithm's own state (estimator, loss, optimizer, generators, counters)."""
        cfg = run.cfg
        self.run = run  # kept whole, read where needed: the trainer copies none of its fields
        self.world = dist.world_size()
        self.corr = RolloutCorrection.of(
            run.engine_caps.rollout_correction(cfg.correction.mode), cfg.correction
        )
        self.adv_fn = get_advantage_estimator(cfg.advantage.name, **cfg.advantage.hyperparameters())
        self.loss_fn = get_policy_loss(cfg.loss.name)
        self.local_mini = cfg.mini_batch_size // self.world  # trajectories per update on this rank
        updates = cfg.steps * cfg.ppo_epochs * -(-cfg.prompts_per_step * cfg.n // cfg.mini_batch_size)
        self.opt, self.sched = build_optimizer(run.policy, cfg.optim, updates)
        self.rng = random.Random(run.seed)
        self.gen = torch.Generator().manual_seed(dist.rank_seed(run.seed))  # sampling, mini-batch order
        self._order: list[int] = []
        self.norm_len = cfg.loss.norm_len or run.agent.config.max_response_tokens
        self.skips = SkipGuard(cfg.optim.max_skipped_in_row)
        self.ahead = lookahead(cfg.off_policy_steps)  # the batch sampled during the update
        self.stream = self._producer()  # groups sampled continuously (rl.stream.enabled)
        self.rank_state = (
            "generator",
            *(("pending",) if self.ahead else ()),
            *(("stream",) if self.stream else ()),
        )
        self.rounds = 0  # rounds of prompts handed to the stream producer
        self.trained_groups: list[tuple[int, int]] = []  # (round, index) of every streamed group trained
        self.updates_done = self.step_done = 0
        self.timers = Timers()
        self.last_trajectories: list[Trajectory] = []
        compiled = CompiledLayers(run.policy, run.compile_pad_multiple) if run.compile_pad_multiple else None
        self.loss_spec = LossSpec.for_rl(
            cfg, self.loss_fn, self.norm_len, run.sampling.logprob_temperature, run.autocast, compiled
        )

    def _producer(self) -> StreamProducer | None:
        """The stream producer of `rl.stream.*`, for an engine that can stream (checked again on the engine built:
        `rollout.engine=vllm` may be colocated)."""
        run, s = self.run, self.run.cfg.stream
        if not s.enabled:
            return None
        if why := why_not_stream(run.engine_caps, partial=s.partial):
            raise ValueError(why)
        local = run.cfg.prompts_per_step // self.world
        return StreamProducer(
            run.agent, run.sampling, run.reward, n=run.cfg.n, capacity=s.capacity(local),
            max_staleness=s.max_staleness, partial=s.partial,
            workers=max(1, min(s.capacity(local), getattr(run.agent, "concurrency", 1) // run.cfg.n)),
        )  # fmt: skip

    def _submit_round(self) -> None:
        """Hand the producer a step's worth of prompts, each trajectory's request seed drawn as a synchronous step
        draws them (`tirl.train.rl.stream`)."""
        rows, n = self._next_prompts(), self.run.cfg.n
        seeds = draw_seeds(len(rows) * n, self.gen)
        works = [GroupWork(self.rounds, i, r, tuple(seeds[i * n : (i + 1) * n])) for i, r in enumerate(rows)]
        self.stream.submit(works)
        self.rounds += 1

    def _stream_batch(self) -> tuple[list[Trajectory], list[Any], dict[str, float]]:
        """This step's groups from the producer: rounds up to this step + K submitted, then the first finished
        groups within the staleness bound, numbered as a synchronous step numbers them."""
        while self.rounds <= self.step_done + self.run.cfg.stream.max_staleness:
            self._submit_round()
        local = len(dist.rank_share(list(range(self.run.cfg.prompts_per_step))))
        with self.timers.time("rollout"):
            groups, stats = self.stream.take(local, self.run.agent.engine.weight_version, self._submit_round)
        self.trained_groups += [g.work.key for g in groups]
        if self.run.engine_caps.sync_gate:  # such an engine has its gate (tirl.rollout.engines.base)
            stats["stream/interrupted_requests"] = float(self.run.agent.engine.gate.interruptions)
        return (*flatten(groups, dist.rank() * local), rank_reduced(stats))

    def _next_prompts(self) -> list[ProblemRow]:
        """Epoch-wise shuffled prompts: each row is used once before any is reused. Every rank draws the same
        step's prompts (one order, seeded alike) and keeps its own share."""
        out = []
        while len(out) < self.run.cfg.prompts_per_step:
            if not self._order:
                self._order = list(range(len(self.run.rows)))
                self.rng.shuffle(self._order)
            out.append(self.run.rows[self._order.pop()])
        return dist.rank_share(out)

    def _logprobs(self, model: torch.nn.Module, batch: TokenBatch) -> torch.Tensor:
        """(B, T) log-probs of the trained tokens (0 elsewhere), at most `logprob_batch_size` sequences and
        `micro_batch_tokens` padded tokens per forward."""
        return no_grad_logprobs(
            model, batch, max_seqs=self.run.cfg.logprob_batch_size, max_tokens=int(self.run.cfg.micro_batch_tokens),
            temperature=self.run.sampling.logprob_temperature, autocast=self.run.autocast,
            share_prefix=self.run.cfg.share_prefix,
        )  # fmt: skip

    def _rollout(
        self, rows: Sequence[ProblemRow], first_group: int, gen: torch.Generator | None = None
    ) -> tuple[list[Trajectory], list[Any]]:
        """`n` trajectories per row, scored; their groups number the rows from `first_group` on."""
        self.run.policy.eval()
        return rollout_and_score(
            self.run.agent, rows, self.run.sampling, n=self.run.cfg.n, reward=self.run.reward,
            generator=self.gen if gen is None else gen, first_group=first_group, where=f"RL step {self.step_done}", timed=self.timers.time,
            sampling_context=self._sampling_context,
        )  # fmt: skip

    def _sampling_context(self) -> Any:
        """The whole model on each rank (an engine sharing the policy) and the engine awake: a colocated engine
        sleeps outside the rollouts, the torch engine drops what it keeps for them (packed weights, kept KV)."""
        stack = contextlib.ExitStack()
        if self.run.engine_caps.shares_policy:
            stack.enter_context(fsdp.gathered(self.run.policy))
        stack.enter_context(awake(self.run.agent.engine))
        return stack

    def _sample_ahead(self) -> None:
        """Start sampling the next step's batch in the background; its prompts and seed are drawn here."""
        rows = self._next_prompts()
        gen = torch.Generator().manual_seed(int(torch.randint(2**62, (1,), generator=self.gen)))
        self.ahead.start(lambda: (*self._rollout(rows, dist.rank() * len(rows), gen), {}))

    def _sample_batch(self) -> tuple[list[Trajectory], list[Any], dict[str, float]]:
        """This step's trajectories; with dynamic sampling (DAPO), only groups with a reward signal, refilled from
        new prompts for up to `dynamic_max_rounds` extra rounds, trimmed to `prompts_per_step` groups."""
        cfg = self.run.cfg
        rows = self._next_prompts()
        trajs, scores = self._rollout(rows, dist.rank() * len(rows))  # group numbers unique over ranks
        if not cfg.dynamic_sampling:
            return trajs, scores, {}
        drawn_t, drawn_s, rounds = list(trajs), list(scores), 0
        keep_t, keep_s = groups_with_signal(trajs, scores)
        while len(keep_t) < cfg.prompts_per_step * cfg.n and rounds < cfg.dynamic_max_rounds:
            rounds += 1
            more_t, more_s = self._rollout(self._next_prompts(), rounds * cfg.prompts_per_step)
            drawn_t += more_t
            drawn_s += more_s
            t, sc = groups_with_signal(more_t, more_s)
            keep_t, keep_s = keep_t + t, keep_s + sc
        keep_t, keep_s = keep_t[: cfg.prompts_per_step * cfg.n], keep_s[: cfg.prompts_per_step * cfg.n]
        stats = {
            "dynamic/rounds": float(rounds),
            "dynamic/groups_drawn": float(len(drawn_t) // cfg.n),
            "dynamic/groups_kept": float(len(keep_t) // cfg.n),
        }
        if not keep_t:  # no group had a signal in any round: nothing to learn from this step
            return drawn_t, drawn_s, stats
        return keep_t, keep_s, stats

    def step(self) -> dict[str, float]:
        cfg = self.run.cfg
        t0 = time.time()
        if self.stream:
            trajs, scores, dyn = self._stream_batch()
        else:
            trajs, scores, dyn = (self.ahead and self.ahead.take()) or self._sample_batch()
        version = self.run.agent.engine.weight_version
        stale = staleness_metrics(trajs, version) if self.ahead or self.stream else {}
        if self.ahead and self.step_done + 1 < cfg.steps:
            self._sample_ahead()
        t_rollout = time.time() - t0
        fidelity = token_fidelity(trajs, self.run.agent.renderer, self.run.agent.config.token_stream)
        rewards = torch.tensor([s.reward for s in scores])
        groups = torch.tensor([t.group for t in trajs])
        adv = self.adv_fn(rewards, groups)
        device = next(self.run.policy.parameters()).device
        batch = trajectory_batch(trajs, adv, pad_id=self.run.agent.renderer.pad_id).to(device)
        truncated = [i for i, t in enumerate(trajs) if t.stop_reason in TRUNCATED]
        if cfg.overlong_filter and truncated:
            batch.loss_mask[truncated] = (
                0  # DAPO's overlong filtering: a cut-off answer is no evidence either way
            )
        with self.timers.time("update"):
            update, mismatch = self._train_on(batch, trajs)
        metrics, stats = global_rollout_metrics(trajs, scores, rewards, groups, adv)
        metrics.update(update)
        metrics.update(fidelity)
        metrics.update(dyn)
        metrics.update(rank_reduced(mismatch | stale))
        perf = self.timers.pop()
        perf["perf/step_s/update"] -= perf.get("perf/step_s/sync", 0.0)  # sync is timed inside the update
        sampled = sum(s.sampled_tokens for s in stats)
        trained = dist.sum_floats({"t": float(batch.attention_mask.sum())})["t"]
        metrics.update(perf)
        metrics.update(peak_memory_mb())  # this process's
        metrics["perf/tokens_per_s/rollout"] = sampled / max(perf.get("perf/step_s/rollout", 0.0), 1e-9)
        metrics["perf/tokens_per_s/update"] = cfg.ppo_epochs * trained / max(perf["perf/step_s/update"], 1e-9)
        self.last_trajectories = trajs
        metrics.update({"time/rollout": t_rollout, "time/step": time.time() - t0})
        return metrics

    def _train_on(
        self, batch: TokenBatch, trajs: Sequence[Trajectory]
    ) -> tuple[dict[str, float], dict[str, float]]:
        """The step's updates on `batch` (its metrics) and the engine/trainer mismatch metrics.

        One update per step on the whole batch is exactly on-policy: the old log-probs are the policy's own log-probs
        of that forward pass (detached), as verl does, and a rollout correction is computed in that pass too.
        Otherwise an engine whose log-probs are the trainer's own supplies them; any other is recomputed, to measure
        the mismatch and correct for it (capabilities)."""
        cfg = self.run.cfg
        on_policy = cfg.ppo_epochs == 1 and self.local_mini >= len(trajs)
        source = self.run.engine_caps.old_logprobs(
            on_policy=on_policy, correction=self.correction, fresh=self._fresh, mode=cfg.old_logprobs
        )
        old_logp, mismatch, in_pass = None, {}, source == "policy" and self.corr.active
        if source == "engine":
            old_logp = rollout_logprobs(trajs, batch.input_ids)
        elif source == "recompute":
            old_logp = self._logprobs(self.run.policy, batch)
            mismatch = self.corr.apply(batch, old_logp, rollout_logprobs(trajs, batch.input_ids))
        elif in_pass:
            batch.extra["rollout_logp"] = rollout_logprobs(trajs, batch.input_ids)
        ref_logp = None
        if self.run.reference is not None:
            with self.run.reference.model() as ref:
                ref_logp = self._logprobs(ref, batch)
        seen = torch.zeros_like(batch.loss_mask) if in_pass else None
        update = self._update(batch, old_logp, ref_logp, seen)
        if seen is not None:
            mismatch = self.corr.weights(seen, batch.extra["rollout_logp"], batch.loss_mask)[1]
        return update, mismatch

    def _update(
        self,
        batch: TokenBatch,
        old_logp: torch.Tensor | None,
        ref_logp: torch.Tensor | None,
        seen: torch.Tensor | None = None,
    ) -> dict[str, float]:
        """Policy-gradient updates; `old_logp` None means on-policy (one update over the whole batch), and then
        `seen` (B, T), if given, receives that pass's detached log-probs and the rollout correction is applied in
        it (`tirl.train.rl.update`)."""
        cfg = self.run.cfg
        spec = self.loss_spec
        if seen is not None:
            spec = dataclasses.replace(spec, correction=self.corr)
        self.run.policy.train()
        B = batch.input_ids.shape[0]
        sums: Counter[str] = Counter()
        updates = 0
        for _ in range(cfg.ppo_epochs):
            order = torch.randperm(B, generator=self.gen)
            for s in range(0, B, self.local_mini):
                idx = order[s : s + self.local_mini]
                mini = slice_rows(batch, idx)
                mini_seen = None if seen is None else torch.zeros_like(mini.loss_mask)
                stats = accumulate_gradients(
                    self.run.policy,
                    mini,
                    None if old_logp is None else old_logp[idx],
                    None if ref_logp is None else ref_logp[idx],
                    spec,
                    mini_seen,
                )
                if seen is not None:
                    seen[idx, : mini.loss_mask.shape[1]] = mini_seen
                norm, stepped = clip_and_step(
                    self.run.policy, self.opt, self.sched, cfg.optim, loss=stats["loss/total"]
                )
                self.skips.record(stepped, where=f"RL update {self.updates_done}")
                self.updates_done += 1
                stats["loss/grad_norm"] = norm
                sums.update(stats)
                updates += 1
        self.run.policy.eval()
        if self.ahead:  # the next batch's requests end before the engine reloads its weights
            self.ahead.wait()
        with self.timers.time("sync"):  # the next rollout must sample from the updated policy
            self.run.agent.engine.sync_weights(self.run.policy)
        out = {k: v / updates for k, v in sums.items()}
        out["optim/lr"] = self.sched.get_last_lr()[0]
        out["loss/skipped_updates"] = float(self.skips.total)
        return out

    def train(self) -> list[dict[str, float]]:
        """Steps from `step_done` (0, or where a resumed checkpoint left off) to `steps`; returns their metrics.

        SIGTERM / SIGINT finish the current step, write a checkpoint and raise `StopRequested`."""
        cfg, history = self.run.cfg, []
        with contextlib.ExitStack() as stack:
            if self.stream:  # the producer stops with the steps, however they end
                stack.callback(self.stream.close)
            self._steps(history)
        per_step = max(1, self.updates_done // max(1, self.step_done))  # every step takes as many updates
        first = (self.updates_done - self.skips.in_row) // per_step
        manifest.check_last_update(self.skips.in_row, f"RL step {first}")
        fsdp.save_model(
            self.run.policy, self.run.tokenizer, self.run.out_dir / "model", extra={"step": cfg.steps}
        )
        return history

    def _steps(self, history: list[dict[str, float]]) -> None:
        """Steps from `step_done` to `steps`, each logged, validated when due and checkpointed when due."""
        cfg = self.run.cfg
        with graceful_stop() as stop, progress("RL", cfg.steps) as bar:
            bar.advance(self.step_done)
            for step in range(self.step_done, cfg.steps):
                m = self.step()
                history.append(m)
                if self.run.logger:
                    self.run.logger.log(m, step=step)
                    self.run.logger.log_text(
                        "samples", render_samples(self.last_trajectories, self.run.tokenizer), step=step
                    )
                manifest.check_weights(self.run.policy, f"RL step {step}")
                self.step_done = step + 1
                if (
                    self.run.validate is not None
                    and cfg.validation.every
                    and self.step_done % cfg.validation.every == 0
                ):
                    with fsdp.gathered(self.run.policy):
                        val = self.run.validate(self.step_done)
                    m.update(val)
                    if self.run.logger:
                        self.run.logger.log(val, step=step)
                bar.advance(1, info=f"reward {m['reward/mean']:+.2f}  acc {m['reward/accuracy']:.2f}")
                checkpoint.save_if_due(
                    self, self.run.out_dir, step=self.step_done, every=cfg.save_every,
                    stopping=dist.any_rank(stop.requested), tokenizer=self.run.tokenizer, keep_last=cfg.keep_last,
                )  # fmt: skip

    @property
    def _fresh(self) -> bool:
        """The rollouts come from the weights this step starts with (never sampled ahead of the last sync)."""
        return self.ahead is None and (self.stream is None or self.run.cfg.stream.max_staleness == 0)

    @property
    def correction(self) -> str:
        """`rl.correction.mode` resolved for this engine."""
        return self.corr.mode

    @property
    def model(self) -> torch.nn.Module:
        return self.run.policy

    @property
    def identity(self) -> manifest.RunIdentity | None:
        return self.run.identity

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self.opt

    def state_dict(self) -> dict[str, Any]:
        """Everything the next step depends on besides the weights, the optimizer and the global generators."""
        return (
            {
                "step": self.step_done,
                "scheduler": self.sched.state_dict(),
                "order": list(self._order),
                "order_rng": self.rng.getstate(),
                "generator": self.gen.get_state(),
                "updates_done": self.updates_done,
                "skips": (self.skips.in_row, self.skips.total),
                "ref_source": self.run.ref_source,
                "wandb_id": self.run.logger.run_id if self.run.logger else None,
            }
            | ({"pending": self.ahead.pending} if self.ahead else {})
            | self._stream_state()
        )

    def _stream_state(self) -> dict[str, Any]:
        """The producer's buffer and unfinished work (`StreamProducer.snapshot`), with the rounds drawn so far."""
        if not self.stream:
            return {}
        snap = self.stream.snapshot(self.run.agent.engine.weight_version)
        return {"stream": snap | {"rounds": self.rounds, "trained_groups": list(self.trained_groups)}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The restored weights (already in the policy) reach a server engine too: it still serves the weights it
        started with."""
        if self.run.reference is not None and state.get("ref_source") != self.run.ref_source:
            raise CheckpointError(
                f"the checkpoint's KL reference is {state.get('ref_source')!r} but this run's model.path is "
                f"{self.run.ref_source!r}: resume with the model.path the run started from"
            )
        self.step_done = int(state["step"])
        self.sched.load_state_dict(state["scheduler"])
        self._order = [i for i in state["order"] if i < len(self.run.rows)]  # fewer rows: a changed data file
        self.rng.setstate(state["order_rng"])
        if "generator" in state:  # absent for a rank the checkpoint's run did not have: it keeps its own seed
            self.gen.set_state(state["generator"])
        self.updates_done = int(state["updates_done"])
        self.skips.in_row, self.skips.total = state["skips"]
        if self.ahead:  # the batch sampled during the checkpointed step's update (tirl.train.rl.overlap)
            self.ahead.pending = state.get("pending")
        if self.run.engine_caps.sync_on_resume:  # a server engine still serves the weights it started with
            self.run.agent.engine.sync_weights(self.run.policy)
        if (
            self.stream and state.get("stream") is not None
        ):  # its groups keep their age on the engine's counter
            self.rounds = int(state["stream"]["rounds"])
            self.trained_groups = list(state["stream"]["trained_groups"])
            self.stream.restore(state["stream"], self.run.agent.engine.weight_version)


__all__ = ["RLConfig", "RLTrainer", "trajectory_batch"]
