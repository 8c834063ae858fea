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
   Each way of sampling a step's batch is a class of `tirl.train.rl.sampling`; the loop asks the chosen one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import torch

from tirl.algorithms import get_advantage_estimator, get_policy_loss
from tirl.core.progress import progress
from tirl.rollout.types import Trajectory
from tirl.train import checkpoint, dist, fsdp, manifest
from tirl.train.batch import TokenBatch, slice_rows
from tirl.train.compiled import CompiledLayers
from tirl.train.manifest import CheckpointError
from tirl.train.optim import SkipGuard, build_optimizer, clip_and_step
from tirl.train.perf import Timers, peak_memory_mb
from tirl.train.rl.batch import (
    TRUNCATED,
    global_rollout_metrics,
    rank_reduced,
    render_samples,
    rollout_logprobs,
    trajectory_batch,
)
from tirl.train.rl.config import RLConfig
from tirl.train.rl.correction import RolloutCorrection
from tirl.train.rl.run import RLRun
from tirl.train.rl.sampling import sampling_mode
from tirl.train.rl.token_check import token_fidelity
from tirl.train.rl.update import LossSpec, accumulate_gradients, no_grad_logprobs
from tirl.train.signals import graceful_stop


class RLTrainer:
    """The GRPO-TCR loop; checkpointed and resumed through `tirl.train.checkpoint.Resumable`."""

    # "generator" (each rank samples and orders mini-batches with its own) and the sampling mode's own entries
    rank_state: tuple[str, ...]

    def __init__(self, run: RLRun) -> None:
        """`run`: the policy, engine, prompts and settings, checked and sized (`tirl.train.rl.run.assemble`); the
        trainer adds only the algorithm's own state (estimator, loss, optimizer, generators, counters) and the
        sampling mode `rl.*` names (`tirl.train.rl.sampling`)."""
        cfg = run.cfg
        self.run = run  # kept whole, read where needed: the trainer copies none of its fields
        self.corr = RolloutCorrection.of(
            run.engine_caps.rollout_correction(cfg.correction.mode), cfg.correction
        )
        self.adv_fn = get_advantage_estimator(cfg.advantage.name, **cfg.advantage.hyperparameters())
        self.local_mini = cfg.mini_batch_size // dist.world_size()  # trajectories per update on this rank
        updates = cfg.steps * cfg.ppo_epochs * -(-cfg.prompts_per_step * cfg.n // cfg.mini_batch_size)
        self.opt, self.sched = build_optimizer(run.policy, cfg.optim, updates)
        self.gen = torch.Generator().manual_seed(dist.rank_seed(run.seed))  # sampling, mini-batch order
        self.skips = SkipGuard(cfg.optim.max_skipped_in_row)
        self.timers = Timers()
        # synchronous, dynamic, ahead or streaming
        self.sampling_mode = sampling_mode(run, self.gen, self.timers)
        self.prompts = self.sampling_mode.rollouts.prompts
        self.rank_state = ("generator", *self.sampling_mode.rank_state)
        self.updates_done = self.step_done = 0
        self.last_trajectories: list[Trajectory] = []
        compiled = CompiledLayers(run.policy, run.compile_pad_multiple) if run.compile_pad_multiple else None
        norm_len = cfg.loss.norm_len or run.agent.config.max_response_tokens
        loss_fn, temperature = get_policy_loss(cfg.loss.name), run.sampling.logprob_temperature
        self.loss_spec = LossSpec.for_rl(cfg, loss_fn, norm_len, temperature, run.autocast, compiled)

    def _logprobs(self, model: torch.nn.Module, batch: TokenBatch) -> torch.Tensor:
        """(B, T) log-probs of the trained tokens (0 elsewhere), at most `logprob_batch_size` sequences and
        `micro_batch_tokens` padded tokens per forward."""
        cfg = self.run.cfg
        return no_grad_logprobs(
            model,
            batch,
            max_seqs=cfg.logprob_batch_size,
            max_tokens=int(cfg.micro_batch_tokens),
            temperature=self.run.sampling.logprob_temperature,
            autocast=self.run.autocast,
            share_prefix=cfg.share_prefix,
        )

    def step(self) -> dict[str, float]:
        """One step: the sampling mode's batch, its advantages, the update; returns the step's metrics."""
        cfg = self.run.cfg
        t0 = time.time()
        sampled = self.sampling_mode.batch(self.step_done)
        trajs, scores = sampled.trajs, sampled.scores
        t_rollout = time.time() - t0
        agent = self.run.agent
        fidelity = (
            token_fidelity(trajs, agent.renderer, agent.config.token_stream)
            if agent.builds_from_problem
            else {}
        )
        rewards = torch.tensor([s.reward for s in scores])
        groups = torch.tensor([t.group for t in trajs])
        adv = self.adv_fn(rewards, groups)
        device = next(self.run.policy.parameters()).device
        batch = trajectory_batch(trajs, adv, pad_id=self.run.agent.renderer.pad_id).to(device)
        truncated = [i for i, t in enumerate(trajs) if t.stop_reason in TRUNCATED]
        if cfg.overlong_filter and truncated:  # DAPO's overlong filtering: a cut-off answer is no evidence
            batch.loss_mask[truncated] = 0
        with self.timers.time("update"):
            update, mismatch = self._train_on(batch, trajs)
        metrics, stats = global_rollout_metrics(trajs, scores, rewards, groups, adv)
        metrics.update(update)
        metrics.update(fidelity)
        metrics.update(dist.sum_floats(agent.episode_metrics()))  # an agent program's episode outcomes
        metrics.update(sampled.metrics)
        metrics.update(rank_reduced(mismatch | sampled.staleness))
        perf = self.timers.pop()
        perf["perf/step_s/update"] -= perf.get("perf/step_s/sync", 0.0)  # sync is timed inside the update
        sampled_tokens = sum(s.sampled_tokens for s in stats)
        trained = dist.sum_floats({"t": float(batch.attention_mask.sum())})["t"]
        metrics.update(perf)
        metrics.update(peak_memory_mb())  # this process's
        metrics["perf/tokens_per_s/rollout"] = sampled_tokens / max(
            perf.get("perf/step_s/rollout", 0.0), 1e-9
        )
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
        fresh = self.sampling_mode.fresh  # sampled from the weights this step starts with
        source = self.run.engine_caps.old_logprobs(
            on_policy=on_policy, correction=self.correction, fresh=fresh, mode=cfg.old_logprobs
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
        self.sampling_mode.before_sync()
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
            # a stream's producer stops with the steps, however they end
            stack.callback(self.sampling_mode.close)
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
                    self,
                    self.run.out_dir,
                    step=self.step_done,
                    every=cfg.save_every,
                    stopping=dist.any_rank(stop.requested),
                    tokenizer=self.run.tokenizer,
                    keep_last=cfg.keep_last,
                )

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
        return {
            "step": self.step_done,
            "scheduler": self.sched.state_dict(),
            "order": list(self.prompts.order),
            "order_rng": self.prompts.rng.getstate(),
            "generator": self.gen.get_state(),
            "updates_done": self.updates_done,
            "skips": (self.skips.in_row, self.skips.total),
            "ref_source": self.run.ref_source,
            "wandb_id": self.run.logger.run_id if self.run.logger else None,
        } | self.sampling_mode.state_dict()

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
        # fewer rows: a changed data file
        self.prompts.order = [i for i in state["order"] if i < len(self.run.rows)]
        self.prompts.rng.setstate(state["order_rng"])
        if "generator" in state:  # absent for a rank the checkpoint's run did not have: it keeps its own seed
            self.gen.set_state(state["generator"])
        self.updates_done = int(state["updates_done"])
        self.skips.in_row, self.skips.total = state["skips"]
        if self.run.engine_caps.sync_on_resume:  # a server engine still serves the weights it started with
            self.run.agent.engine.sync_weights(self.run.policy)
        self.sampling_mode.load_state_dict(state)


__all__ = ["RLConfig", "RLTrainer", "trajectory_batch"]
