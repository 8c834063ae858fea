"""AdamW with a warm-up and decay schedule, gradient clipping and the non-finite-update guard: what every trainer
shares.

The defaults are verl's (the reference recipe's RL trainer): betas (0.9, 0.999), eps 1e-8, and weight decay on
every parameter; verl's SFT trainer uses beta2 0.95 with a 10% warm-up and cosine decay (SFTConfig's default) (verl passes `module.parameters()` to AdamW as one group). `decay_all: false` exempts biases and
norm weights, the common LLM-pretraining choice, which the demo's settings were measured with.
"""

from __future__ import annotations

import math

import torch

from tirl.core.errors import TirlError
from tirl.core.regions import region
from tirl.train.config import OptimConfig


def lr_factor(step: int, total: int, cfg: OptimConfig) -> float:
    """Multiplier of the base lr at optimizer step `step` (0-based) out of `total`."""
    warmup = int(cfg.warmup_ratio * total)
    if step < warmup:
        return (step + 1) / warmup
    if cfg.schedule == "constant" or total <= warmup:
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    decay = 0.5 * (1 + math.cos(math.pi * progress)) if cfg.schedule == "cosine" else 1 - progress
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * decay


def _fusable(params: list[torch.Tensor]) -> bool:
    """PyTorch's fused AdamW takes these: plain (unsharded) floating-point tensors on a CPU or CUDA device. It
    updates every tensor in one kernel: 132M float32 parameters stepped in 0.085 s against 0.35 s on 2 cores."""
    return bool(params) and all(
        type(p.data) is torch.Tensor and p.is_floating_point() and p.device.type in ("cpu", "cuda")
        for p in params
    )


def build_optimizer(
    model: torch.nn.Module, cfg: OptimConfig, total_steps: int
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW (fused where `_fusable`) and its schedule over `total_steps` optimizer steps (`cfg.decay_all` says
    which parameters decay)."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            exempt = not cfg.decay_all and (p.ndim < 2 or "norm" in name)
            (no_decay if exempt else decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    opt = torch.optim.AdamW(
        groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, fused=_fusable(decay + no_decay) or None
    )
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, max(1, total_steps), cfg))
    return opt, sched


def clip_and_step(
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    sched: torch.optim.lr_scheduler.LambdaLR,
    cfg: OptimConfig,
    *,
    loss: float = 0.0,
) -> tuple[float, bool]:
    """Clip gradients, step optimizer and schedule, zero the gradients; returns (pre-clip grad norm, stepped).

    A non-finite `loss` or gradient norm skips the update: gradients are dropped and no parameter, optimizer
    moment or schedule position changes (one NaN would otherwise poison AdamW's moments for good).
    """
    with region("tirl/update/optimizer"):
        params = [p for p in model.parameters() if p.grad is not None]
        max_norm = cfg.grad_clip if cfg.grad_clip > 0 else float("inf")
        total = torch.nn.utils.clip_grad_norm_(params, max_norm)
        norm = float(
            total.full_tensor() if hasattr(total, "full_tensor") else total
        )  # FSDP: a replicated DTensor
        stepped = math.isfinite(norm) and math.isfinite(loss)
        if stepped:
            opt.step()
            if opt.defaults.get("fused"):
                # fused AdamW writes the parameters in place without bumping their version counters: bump them, or
                # a cache keyed on the version (the LM head's bf16 copy, tirl.train.head) keeps serving old weights
                torch.autograd.graph.increment_version([p for g in opt.param_groups for p in g["params"]])
            sched.step()
        opt.zero_grad(set_to_none=True)
    return norm, stepped


class NonFiniteError(TirlError):
    """Several updates in a row had a non-finite loss or gradient: the run cannot recover by itself."""


class SkipGuard:
    """Counts updates skipped by `clip_and_step`; `limit` skips in a row raise `NonFiniteError`.

    A single NaN batch (an overflow, a degenerate sample) is survivable and only logged; a run of them means the
    weights or the data are broken, and going on would only burn compute (and overwrite good checkpoints).
    """

    def __init__(self, limit: int) -> None:
        self.limit, self.in_row, self.total = limit, 0, 0

    def record(self, stepped: bool, *, where: str) -> None:
        if stepped:
            self.in_row = 0
            return
        self.in_row += 1
        self.total += 1
        if self.in_row >= self.limit:
            raise NonFiniteError(
                f"{where}: {self.in_row} updates in a row had a non-finite loss or gradient norm and were skipped; "
                "stopping (no parameters were changed by them; the last checkpoint is intact). Lower the learning "
                "rate, check the data, or raise optim.max_skipped_in_row"
            )
