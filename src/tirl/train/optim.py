"""AdamW with a warm-up and decay schedule, and gradient clipping: what every trainer shares."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch


@dataclass
class OptimConfig:
    lr: float = 1e-5
    weight_decay: float = 0.01
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0  # max global grad norm; <= 0 disables clipping
    warmup_ratio: float = 0.0
    schedule: Literal["constant", "cosine", "linear"] = "constant"
    min_lr_ratio: float = 0.0  # the decay floor, as a share of lr

    def __post_init__(self) -> None:
        if self.lr <= 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if not 0 <= self.warmup_ratio < 1:
            raise ValueError(f"warmup_ratio must be in [0, 1), got {self.warmup_ratio}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")


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


def build_optimizer(
    model: torch.nn.Module, cfg: OptimConfig, total_steps: int
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW (no weight decay on biases and norms) and its schedule over `total_steps` optimizer steps."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (no_decay if p.ndim < 2 or "norm" in name else decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, max(1, total_steps), cfg))
    return opt, sched


def clip_and_step(
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    sched: torch.optim.lr_scheduler.LambdaLR,
    cfg: OptimConfig,
) -> float:
    """Clip gradients, step optimizer and schedule, zero the gradients; returns the pre-clip grad norm."""
    params = [p for p in model.parameters() if p.grad is not None]
    max_norm = cfg.grad_clip if cfg.grad_clip > 0 else float("inf")
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    opt.step()
    sched.step()
    opt.zero_grad(set_to_none=True)
    return float(norm)
