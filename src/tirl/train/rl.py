"""RL with GRPO-TCR on multi-turn tool rollouts: a readable loop that calls its collaborators.

One step: sample prompts, roll each out `n` times through the agent loop, score them, turn rewards into group
advantages, recompute old log-probs with the policy, then take mini-batch policy-gradient steps.

How this departs from textbook GRPO (the reference recipe's choices unless noted):
1. Token-level loss (`token-mean`): every trained token in a mini-batch weighs the same (the "T"; verl's: token_mean).
2. Clip-higher: asymmetric ratio clip 1-0.2 / 1+0.28 (the "C"), plus dual-clip (c = 10) for negative advantages.
3. Overlong reward shaping (DAPO): a soft penalty as the response nears the budget (the "R").
4. No KL penalty and no reference model by default; `kl_coef > 0` turns on a k1/k3 penalty in the loss.
5. Tool-output tokens are in the context but never in the loss (`loss_mask`), and they count toward the budget.
6. A group whose rewards are all equal gets exactly zero advantage (group statistics in float64, equal groups
   detected explicitly); `adv/zero_share` is the share of such groups. No dynamic re-sampling replaces them.
7. Old log-probs: with a single update per step, the detached log-probs of that update's own forward pass (as verl
   does); with several, the engine's sampling log-probs where they are the trainer's own to float rounding (the
   torch engine in fp32, sampling with the step's starting weights: verl's bypass mode), else a no-grad pass of
   the policy before the first update, which also measures the engine/trainer mismatch (`rl.old_logprobs`).
8. `seq-mean-token-sum-norm` divides by a fixed length (`rl.loss_norm_len`, default the response budget), never
   by the padded length of the batch, which would bring back the length bias it exists to remove.
9. An update whose loss or gradient norm is not finite is skipped (parameters, AdamW moments and the schedule
   untouched) and counted in `loss/skipped_updates`; `optim.max_skipped_in_row` in a row stop the run.
10. Groups of one (`n = 1`) are refused: every group-relative estimator gives them zero advantage (verl's GRPO
   instead passes the raw reward through, an unbaselined REINFORCE), so such a run would silently learn nothing.
11. Under torchrun, each rank takes its share of the step's prompts (`dist.rank_share`) and samples all `n`
   rollouts of each, with its own in-process engine or from the shared vLLM servers (seeds from seed and rank):
   groups stay whole on one rank, so advantages need no communication and no token crosses ranks; only loss
   normalizers, gradients and metrics are reduced. The weight sync after each update is collective.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from tirl.algorithms import check_advantage, get_advantage_estimator, get_policy_loss
from tirl.algorithms.rollout_correction import CORRECTIONS, correction_weights, mismatch_metrics
from tirl.config import check_range
from tirl.data.records import ProblemRow, problem_rows
from tirl.logging import MetricsLogger
from tirl.progress import progress
from tirl.rewards.rollouts import rollout_and_score
from tirl.rewards.shaping import RewardConfig
from tirl.rollout.agent import AgentLoop
from tirl.rollout.capabilities import capabilities_of
from tirl.rollout.factory import awake, rl_refusal
from tirl.rollout.sampling import SamplingParams
from tirl.rollout.types import Trajectory
from tirl.train import checkpoint, dist, fsdp
from tirl.train.batch import TokenBatch, check_micro_batch, slice_rows
from tirl.train.checkpoint import CheckpointError
from tirl.train.memory import sized_micro_batches
from tirl.train.optim import OptimConfig, SkipGuard, build_optimizer, clip_and_step
from tirl.train.overlap import check_off_policy, lookahead, staleness
from tirl.train.perf import Timers, peak_memory_mb
from tirl.train.reference import Reference
from tirl.train.rl_batch import (
    TRUNCATED,
    check_world,
    fitting_prompts,
    global_rollout_metrics,
    groups_with_signal,
    rank_reduced,
    render_samples,
    rollout_logprobs,
    trajectory_batch,
)
from tirl.train.signals import StopRequested, graceful_stop
from tirl.train.update import LossSpec, accumulate_gradients, no_grad_logprobs


@dataclass
class RLConfig:
    data: str = ""  # JSONL of RL rows (verl schema: prompt, reward_model.ground_truth, ...)
    steps: int = 20
    prompts_per_step: int = 32
    n: int = 8  # rollouts per prompt (the GRPO group size G)
    mini_batch_size: int = 64  # trajectories per optimizer update
    micro_batch_size: int = 0  # trajectories per forward/backward (gradients accumulate); 0 = the mini-batch
    # padded tokens per forward/backward: auto = sized from model.activation_gib (tirl.train.memory); 0 = none
    micro_batch_tokens: int | Literal["auto"] = "auto"
    ppo_epochs: int = 1
    adv_estimator: str = "grpo"
    policy_loss: str = "ppo"
    clip_low: float = 0.2
    clip_high: float = 0.28
    clip_c: float = 10.0
    loss_agg: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"] = "token-mean"
    loss_norm_len: int = 0  # the constant of seq-mean-token-sum-norm; 0 = the response budget (agent)
    token_mean: Literal["exact", "micro"] = "exact"  # micro: verl's per-micro-batch token-mean (update.py)
    prompt_rewrite: Literal["none", "verl"] = "none"  # verl: the recipe's rl.data rewrite (recipe_prompts.py)
    kl_coef: float = 0.0
    kl_estimator: Literal["k1", "k3"] = "k3"
    entropy_coef: float = 0.0
    passk_k: int = 4  # k of the estimators that take one (the pass@k objectives passk, pkpo)
    # DAPO: drop groups whose rewards are all equal, sample more prompts to refill
    dynamic_sampling: bool = False
    dynamic_max_rounds: int = 3  # extra generation rounds per step at most, when dynamic_sampling is on
    overlong_filter: bool = False  # truncated responses (budget / turn cap hit) are masked out of the loss
    logprob_batch_size: int = 64  # sequences per no-grad forward when recomputing old log-probs
    # auto: the engine's sampling log-probs when they are the trainer's own (capabilities.old_logprobs); recompute:
    # always a no-grad pass (measures the engine/trainer mismatch)
    old_logprobs: Literal["auto", "recompute"] = "auto"
    eval_every: int = (
        0  # steps between validations on eval_data (records kept in OUT/eval/step-<k>/); 0 = none
    )
    eval_data: list[str] = field(
        default_factory=list
    )  # benchmark files validated during training (eval.n each)
    eval_at_start: bool = False  # validate before the first step too (verl's val_before_train)
    log_samples: int = 2  # trajectories per step logged as text (JSONL samples file, TensorBoard, wandb)
    save_every: int = 0  # steps between resumable checkpoints (checkpoint-<step>/); 0 = only the final model
    keep_last: int = 0  # complete checkpoints kept, oldest deleted first, never the newest; 0 = all
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-6, weight_decay=0.01, grad_clip=1.0))
    # engine/trainer log-prob mismatch (tirl.algorithms.rollout_correction): auto = none for an engine that shares
    # the policy module (the torch engine), token_tis otherwise (tirl.rollout.capabilities says why)
    rollout_correction: Literal["auto", "none", "token_tis", "seq_mis"] = "auto"
    tis_cap: float = 2.0  # token_tis: weights min(pi_old / pi_rollout, cap) (verl's rollout_is_threshold)
    # seq_mis: sequences whose ratio is outside [mis_low, mis_high] are masked (TRL's 0, 3)
    mis_low: float = 0.0
    mis_high: float = 3.0
    # 1: step k+1's rollouts are sampled with step k's weights while step k's update runs (tirl.train.overlap)
    off_policy_steps: int = 0

    def __post_init__(self) -> None:
        for name in ("steps", "prompts_per_step", "n", "mini_batch_size", "ppo_epochs", "logprob_batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        get_advantage_estimator(self.adv_estimator)  # fail at start-up, naming the valid choices
        get_policy_loss(self.policy_loss)
        if self.n < 2:
            raise ValueError(
                f"rl.n={self.n}: every prompt would form a group of one, and the group-relative estimator "
                f"{self.adv_estimator!r} has no baseline there, so every advantage is 0 and the run learns nothing; "
                "use rl.n >= 2 (the recipe samples 16 per prompt)"
            )
        try:  # the estimator's own check of its hyperparameters against the group size
            check_advantage(self.adv_estimator, group_size=self.n, k=self.passk_k)
        except ValueError as e:
            raise ValueError(
                f"rl.adv_estimator={self.adv_estimator!r} with rl.n={self.n}, rl.passk_k={self.passk_k}: {e}"
            ) from None
        if self.eval_every < 0 or (self.eval_every and not self.eval_data):
            raise ValueError(
                f"rl.eval_every={self.eval_every} needs rl.eval_data (a list of benchmark files) and must be >= 0"
            )
        if self.save_every < 0 or self.keep_last < 0:
            raise ValueError(
                f"save_every and keep_last must be >= 0, got {self.save_every}, {self.keep_last}"
            )
        if self.dynamic_max_rounds < 0:
            raise ValueError(f"dynamic_max_rounds must be >= 0, got {self.dynamic_max_rounds}")
        check_micro_batch(self.micro_batch_size, self.micro_batch_tokens)
        if self.rollout_correction not in ("auto", *CORRECTIONS):
            raise ValueError(
                f"rl.rollout_correction={self.rollout_correction!r}; valid: auto, {', '.join(CORRECTIONS)}"
            )
        if self.old_logprobs not in ("auto", "recompute"):
            raise ValueError(f"rl.old_logprobs={self.old_logprobs!r}; valid: auto, recompute")
        check_range("clip_low", self.clip_low, 0, 1, high_open=True)  # at load time, not after a rollout
        check_range("entropy_coef", self.entropy_coef)
        for name, low in (("clip_high", 0), ("kl_coef", 0), ("mis_low", 0), ("tis_cap", 0), ("clip_c", 1)):
            check_range(name, getattr(self, name), low, low_open=name in ("tis_cap", "clip_c"))
        check_range("mis_high", self.mis_high, self.mis_low, low_open=True, low_name="mis_low")
        check_off_policy(self.off_policy_steps, dynamic_sampling=self.dynamic_sampling)
        if self.loss_norm_len < 0:
            raise ValueError(
                f"loss_norm_len must be >= 0 (0 = the response budget), got {self.loss_norm_len}"
            )


class RLTrainer:
    """The GRPO-TCR loop; checkpointed and resumed through `tirl.train.checkpoint.Resumable`."""

    rank_state: tuple[str, ...] = ("generator",)  # each rank samples and orders mini-batches with its own

    def __init__(
        self,
        policy: torch.nn.Module,
        tokenizer: Any,
        agent: AgentLoop,
        rows: Sequence[dict[str, Any] | ProblemRow],
        cfg: RLConfig,
        *,
        sampling: SamplingParams,
        reward: RewardConfig,
        out_dir: str | Path,
        seed: int,
        logger: MetricsLogger | None = None,
        ref_source: str = "",
        autocast: torch.dtype | None = None,
        ref_dtype: torch.dtype | None = None,
        ref_model: torch.nn.Module | None = None,
        activation_gib: float = 0.0,
    ) -> None:
        """`ref_model`: the KL reference's copy when `policy` cannot be copied (FSDP-sharded; else a frozen copy of
        `policy`, none for LoRA). `activation_gib`: what `micro_batch_tokens: auto` sizes for (tirl.train.memory)."""
        if not rows:
            raise ValueError("RL needs at least one prompt row")
        rows = fitting_prompts(problem_rows(rows), agent.renderer, agent.config.max_prompt_tokens)
        cfg, self.micro_budget = sized_micro_batches(cfg, policy, autocast, activation_gib)
        self.policy, self.tokenizer, self.agent, self.rows, self.cfg = policy, tokenizer, agent, rows, cfg
        self.sampling, self.reward, self.out_dir, self.logger = sampling, reward, Path(out_dir), logger
        self.pad_id = agent.renderer.pad_id
        self.engine_caps = capabilities_of(agent.engine).with_precision(None, autocast)  # bf16: not exact
        self.world = dist.world_size()
        check_world(cfg, self.world)
        if why := rl_refusal(self.engine_caps, self.world):
            raise ValueError(why)
        self.engine_caps.check_rl_sampling(sampling)
        self.correction = self.engine_caps.rollout_correction(cfg.rollout_correction)
        self.adv_fn = get_advantage_estimator(cfg.adv_estimator, k=cfg.passk_k)
        self.loss_fn = get_policy_loss(cfg.policy_loss)
        self.local_mini = cfg.mini_batch_size // self.world  # trajectories per update on this rank
        self.autocast = autocast  # model.autocast's dtype; the KL reference: LoRA's base, else a copy
        self.ref = Reference(policy, ref_dtype, copy=ref_model) if cfg.kl_coef > 0 else None
        updates = cfg.steps * cfg.ppo_epochs * -(-cfg.prompts_per_step * cfg.n // cfg.mini_batch_size)
        self.opt, self.sched = build_optimizer(policy, cfg.optim, updates)
        self.rng = random.Random(seed)
        self.gen = torch.Generator().manual_seed(
            dist.rank_seed(seed)
        )  # sampling and mini-batch order: per rank
        self._order: list[int] = []
        self.norm_len = cfg.loss_norm_len or agent.config.max_response_tokens
        self.skips = SkipGuard(cfg.optim.max_skipped_in_row)
        self.ahead = lookahead(cfg.off_policy_steps, self.engine_caps)  # the batch sampled during the update
        self.rank_state = ("generator", "pending") if self.ahead else ("generator",)
        self.updates_done = self.step_done = 0
        self.timers = Timers()
        self.last_trajectories: list[Trajectory] = []
        self.validate: Any = None  # step -> metrics; set by the caller when rl.eval_every is on
        self.identity: checkpoint.RunIdentity | None = None  # what its checkpoints record; set by the caller
        self.ref_source = ref_source  # where the KL reference (the initial policy) was loaded from
        self.loss_spec = LossSpec.for_rl(
            cfg, self.loss_fn, self.norm_len, sampling.logprob_temperature, autocast
        )

    def _next_prompts(self) -> list[ProblemRow]:
        """Epoch-wise shuffled prompts: each row is used once before any is reused. Every rank draws the same
        step's prompts (one order, seeded alike) and keeps its own share."""
        out = []
        while len(out) < self.cfg.prompts_per_step:
            if not self._order:
                self._order = list(range(len(self.rows)))
                self.rng.shuffle(self._order)
            out.append(self.rows[self._order.pop()])
        return dist.rank_share(out)

    def _logprobs(self, model: torch.nn.Module, batch: TokenBatch) -> torch.Tensor:
        """(B, T) log-probs of the trained tokens (0 elsewhere), at most `logprob_batch_size` sequences and
        `micro_batch_tokens` padded tokens per forward."""
        return no_grad_logprobs(
            model, batch, max_seqs=self.cfg.logprob_batch_size, max_tokens=int(self.cfg.micro_batch_tokens),
            temperature=self.sampling.logprob_temperature, autocast=self.autocast,
        )  # fmt: skip

    def _rollout(
        self, rows: Sequence[ProblemRow], first_group: int, gen: torch.Generator | None = None
    ) -> tuple[list[Trajectory], list[Any]]:
        """`n` trajectories per row, scored; their groups number the rows from `first_group` on."""
        self.policy.eval()
        return rollout_and_score(
            self.agent, rows, self.sampling, n=self.cfg.n, reward=self.reward,
            generator=self.gen if gen is None else gen, first_group=first_group, where=f"RL step {self.step_done}", timed=self.timers.time,
            sampling_context=self._sampling_context,
        )  # fmt: skip

    def _sampling_context(self) -> Any:
        """The whole model on each rank (an engine sharing the policy), or a colocated engine awake."""
        return fsdp.gathered(self.policy) if self.engine_caps.shares_policy else awake(self.agent.engine)

    def _sample_ahead(self) -> None:
        """Start sampling the next step's batch in the background; its prompts and seed are drawn here."""
        rows = self._next_prompts()
        gen = torch.Generator().manual_seed(int(torch.randint(2**62, (1,), generator=self.gen)))
        self.ahead.start(lambda: (*self._rollout(rows, dist.rank() * len(rows), gen), {}))

    def _sample_batch(self) -> tuple[list[Trajectory], list[Any], dict[str, float]]:
        """This step's trajectories; with dynamic sampling (DAPO), only groups with a reward signal, refilled from
        new prompts for up to `dynamic_max_rounds` extra rounds, trimmed to `prompts_per_step` groups."""
        cfg = self.cfg
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
        cfg = self.cfg
        t0 = time.time()
        trajs, scores, dyn = (self.ahead and self.ahead.take()) or self._sample_batch()
        stale = staleness(trajs, self.agent.engine.weight_version) if self.ahead else None
        if self.ahead and self.step_done + 1 < cfg.steps:
            self._sample_ahead()
        t_rollout = time.time() - t0
        rewards = torch.tensor([s.reward for s in scores])
        groups = torch.tensor([t.group for t in trajs])
        adv = self.adv_fn(rewards, groups)
        batch = trajectory_batch(trajs, adv, pad_id=self.pad_id).to(next(self.policy.parameters()).device)
        truncated = [i for i, t in enumerate(trajs) if t.stop_reason in TRUNCATED]
        if cfg.overlong_filter and truncated:
            batch.loss_mask[truncated] = (
                0  # DAPO's overlong filtering: a cut-off answer is no evidence either way
            )
        # One update per step on the whole batch is exactly on-policy: the old log-probs are the policy's own log-probs
        # of this forward pass (detached), as verl does. Otherwise an engine whose log-probs are the trainer's own
        # supplies them; any other is recomputed, to measure the mismatch and correct for it (capabilities).
        on_policy = cfg.ppo_epochs == 1 and self.local_mini >= len(trajs)
        source = self.engine_caps.old_logprobs(
            on_policy=on_policy, correction=self.correction, fresh=self.ahead is None, mode=cfg.old_logprobs
        )
        with self.timers.time("update"):
            if source == "engine":
                old_logp = rollout_logprobs(trajs, batch.input_ids)
            else:
                old_logp = self._logprobs(self.policy, batch) if source == "recompute" else None
            mismatch = self._correct(batch, old_logp, trajs) if source == "recompute" else {}
            ref_logp = None
            if self.ref is not None:
                with self.ref.model() as ref:
                    ref_logp = self._logprobs(ref, batch)
            update = self._update(batch, old_logp, ref_logp)
        metrics, stats = global_rollout_metrics(trajs, scores, rewards, groups, adv)
        metrics.update(update)
        metrics.update(dyn)
        metrics.update({} if stale is None else {"rollout/staleness": stale})
        metrics.update(rank_reduced(mismatch))
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

    def _correct(
        self, batch: TokenBatch, old_logp: torch.Tensor, trajs: Sequence[Trajectory]
    ) -> dict[str, float]:
        """Mismatch metrics, and the rollout correction applied to `batch` in place by multiplying its per-token
        advantages by the detached weight: the PPO/dual-clip surrogate is positively homogeneous in the advantage
        (loss(w A) = w loss(A) for w >= 0, tests/algorithms/test_rollout_correction.py), so this weights each
        token's loss without touching the micro-batched update."""
        cfg, sampled = self.cfg, rollout_logprobs(trajs, batch.input_ids)
        out = mismatch_metrics(old_logp, sampled, batch.loss_mask)
        w, stats = correction_weights(
            self.correction,
            old_logp,
            sampled,
            batch.loss_mask,
            cap=cfg.tis_cap,
            low=cfg.mis_low,
            high=cfg.mis_high,
        )
        if w is not None:
            batch.extra["advantages"] = batch.extra["advantages"] * w
        out.update(stats)
        return out

    def _update(
        self, batch: TokenBatch, old_logp: torch.Tensor | None, ref_logp: torch.Tensor | None
    ) -> dict[str, float]:
        """Policy-gradient updates; `old_logp` None means on-policy (one update over the whole batch)."""
        cfg = self.cfg
        self.policy.train()
        B = batch.input_ids.shape[0]
        sums: Counter[str] = Counter()
        updates = 0
        for _ in range(cfg.ppo_epochs):
            order = torch.randperm(B, generator=self.gen)
            for s in range(0, B, self.local_mini):
                idx = order[s : s + self.local_mini]
                stats = accumulate_gradients(
                    self.policy,
                    slice_rows(batch, idx),
                    None if old_logp is None else old_logp[idx],
                    None if ref_logp is None else ref_logp[idx],
                    self.loss_spec,
                )
                norm, stepped = clip_and_step(
                    self.policy, self.opt, self.sched, cfg.optim, loss=stats["loss/total"]
                )
                self.skips.record(stepped, where=f"RL update {self.updates_done}")
                self.updates_done += 1
                stats["loss/grad_norm"] = norm
                sums.update(stats)
                updates += 1
        self.policy.eval()
        if self.ahead:  # the next batch's requests end before the engine reloads its weights
            self.ahead.wait()
        with self.timers.time("sync"):  # the next rollout must sample from the updated policy
            self.agent.engine.sync_weights(self.policy)
        out = {k: v / updates for k, v in sums.items()}
        out["optim/lr"] = self.sched.get_last_lr()[0]
        out["loss/skipped_updates"] = float(self.skips.total)
        return out

    def train(self) -> list[dict[str, float]]:
        """Steps from `step_done` (0, or where a resumed checkpoint left off) to `steps`; returns their metrics.

        SIGTERM / SIGINT finish the current step, write a checkpoint and raise `StopRequested`."""
        cfg, history = self.cfg, []
        with graceful_stop() as stop, progress("RL", cfg.steps) as bar:
            bar.advance(self.step_done)
            for step in range(self.step_done, cfg.steps):
                m = self.step()
                history.append(m)
                if self.logger:
                    self.logger.log(m, step=step)
                    self.logger.log_text(
                        "samples", render_samples(self.last_trajectories, self.tokenizer), step=step
                    )
                self.step_done = step + 1
                if self.validate is not None and cfg.eval_every and self.step_done % cfg.eval_every == 0:
                    with fsdp.gathered(self.policy):
                        val = self.validate(self.step_done)
                    m.update(val)
                    if self.logger:
                        self.logger.log(val, step=step)
                bar.advance(1, info=f"reward {m['reward/mean']:+.2f}  acc {m['reward/accuracy']:.2f}")
                stopping = dist.any_rank(stop.requested)
                if (cfg.save_every and self.step_done % cfg.save_every == 0) or stopping:
                    path = checkpoint.save_trainer(
                        self, self.out_dir, tokenizer=self.tokenizer, keep_last=cfg.keep_last
                    )
                    if stopping:
                        raise StopRequested(str(path), self.step_done)
        fsdp.save_model(self.policy, self.tokenizer, self.out_dir / "model", extra={"step": cfg.steps})
        return history

    @property
    def model(self) -> torch.nn.Module:
        return self.policy

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self.opt

    def state_dict(self) -> dict[str, Any]:
        """Everything the next step depends on besides the weights, the optimizer and the global generators."""
        return {
            "step": self.step_done,
            "scheduler": self.sched.state_dict(),
            "order": list(self._order),
            "order_rng": self.rng.getstate(),
            "generator": self.gen.get_state(),
            "updates_done": self.updates_done,
            "skips": (self.skips.in_row, self.skips.total),
            "ref_source": self.ref_source,
            "wandb_id": self.logger.run_id if self.logger else None,
        } | ({"pending": self.ahead.pending} if self.ahead else {})

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The restored weights (already in the policy) reach a server engine too: it still serves the weights it
        started with."""
        if self.ref is not None and state.get("ref_source") != self.ref_source:
            raise CheckpointError(
                f"the checkpoint's KL reference is {state.get('ref_source')!r} but this run's model.path is "
                f"{self.ref_source!r}: resume with the model.path the run started from"
            )
        self.step_done = int(state["step"])
        self.sched.load_state_dict(state["scheduler"])
        self._order = [i for i in state["order"] if i < len(self.rows)]  # fewer rows: a changed data file
        self.rng.setstate(state["order_rng"])
        if "generator" in state:  # absent for a rank the checkpoint's run did not have: it keeps its own seed
            self.gen.set_state(state["generator"])
        self.updates_done = int(state["updates_done"])
        self.skips.in_row, self.skips.total = state["skips"]
        if self.ahead:  # the batch sampled during the checkpointed step's update (tirl.train.overlap)
            self.ahead.pending = state.get("pending")
        if self.engine_caps.sync_on_resume:  # a server engine still serves the weights it started with
            self.agent.engine.sync_weights(self.policy)
