"""`sft:`, `optim:` and `dist:` of a run's config, checked when loaded: the SFT stage's settings (`tirl.train.sft`),
the optimizer both trainers build (`tirl.train.optim`; `sft.optim` and `rl.optim` are this section with their own
defaults) and multi-process training (`tirl.train.dist`). The RL trainer's `rl:` is `tirl.train.rl.config`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from tirl.core.bounds import MAX_BATCH_TOKENS, MAX_COUNT, MAX_STEPS, MAX_TOKENS, check_counts, check_range

BACKENDS = ("auto", "gloo", "nccl")


def check_micro_batch(micro_batch_size: int, micro_batch_tokens: int | str) -> None:
    """The micro-batch settings of `rl` and `sft`: sizes >= 0 (0 = no bound), or tokens `auto`."""
    tokens_ok = micro_batch_tokens == "auto" or (
        isinstance(micro_batch_tokens, int) and micro_batch_tokens >= 0
    )
    if micro_batch_size < 0 or not tokens_ok:
        raise ValueError(
            f"micro_batch_size must be >= 0 and micro_batch_tokens >= 0 or auto (0 = no bound), "
            f"got {micro_batch_size}, {micro_batch_tokens!r}"
        )


@dataclass
class OptimConfig:
    lr: float = 1e-5
    weight_decay: float = 0.01
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    grad_clip: float = 1.0  # max global grad norm; <= 0 disables clipping
    warmup_ratio: float = 0.0
    schedule: Literal["constant", "cosine", "linear"] = "constant"
    min_lr_ratio: float = 0.0  # the decay floor, as a share of lr
    decay_all: bool = True  # weight decay on every parameter (verl); false: none on biases and norm weights
    max_skipped_in_row: int = 3  # non-finite updates skipped in a row before the run stops with an error

    def __post_init__(self) -> None:
        check_range("lr", self.lr, 0, low_open=True)
        check_range("warmup_ratio", self.warmup_ratio, 0, 1, high_open=True)
        check_range("min_lr_ratio", self.min_lr_ratio, 0, 1)
        check_range("weight_decay", self.weight_decay, 0)
        check_range("beta1", self.beta1, 0, 1, high_open=True)
        check_range("beta2", self.beta2, 0, 1, high_open=True)
        check_range("eps", self.eps, 0, low_open=True)
        check_range("grad_clip", self.grad_clip)  # <= 0 disables clipping
        if self.max_skipped_in_row < 1:
            raise ValueError(f"max_skipped_in_row must be >= 1, got {self.max_skipped_in_row}")
        check_counts(self, "optim", {"max_skipped_in_row": (1, MAX_STEPS)})


@dataclass
class SFTConfig:
    data: str = ""  # JSONL of rows with `messages`
    epochs: int = 3
    batch_size: int = 32
    max_length: int = 1024  # a longer conversation is an error naming the row, never silently cut
    group_by_length: bool = False  # similar lengths per batch: less padding, but batches less mixed
    micro_batch_size: int = 0  # sequences per forward/backward (gradients accumulate); 0 = the whole batch
    # padded tokens per forward/backward: auto = sized from model.activation_gib (tirl.train.memory); 0 = none
    micro_batch_tokens: int | Literal["auto"] = "auto"
    save_every: int = 0  # steps between resumable checkpoints (checkpoint-<step>/, `tirl sft` only); 0 = none
    keep_last: int = 0  # complete checkpoints kept, oldest deleted first, never the newest; 0 = all
    # token: the token mean over the whole batch; micro: verl's SFT loss, the mean over micro-batches of each
    # micro-batch's own token mean (a token of a short micro-batch weighs more)
    loss_mean: Literal["token", "micro"] = "token"
    optim: OptimConfig = field(
        default_factory=lambda: OptimConfig(lr=1e-5, beta2=0.95, schedule="cosine", warmup_ratio=0.1)
    )

    def __post_init__(self) -> None:
        if self.loss_mean not in ("token", "micro"):
            raise ValueError(f"sft.loss_mean must be token or micro, got {self.loss_mean!r}")
        check_micro_batch(self.micro_batch_size, self.micro_batch_tokens)
        if self.save_every < 0 or self.keep_last < 0:
            raise ValueError(
                f"save_every and keep_last must be >= 0, got {self.save_every}, {self.keep_last}"
            )
        if self.epochs < 0 or self.batch_size < 1:
            raise ValueError(
                f"epochs must be >= 0 (0 skips the stage) and batch_size >= 1, "
                f"got {self.epochs}, {self.batch_size}"
            )
        check_counts(self, "sft", {
            "epochs": (0, MAX_STEPS), "batch_size": (1, MAX_COUNT), "max_length": (1, MAX_TOKENS),
            "micro_batch_size": (0, MAX_COUNT), "micro_batch_tokens": (0, MAX_BATCH_TOKENS),
            "save_every": (0, MAX_STEPS), "keep_last": (0, MAX_STEPS),
        })  # fmt: skip


@dataclass
class DistConfig:
    """Multi-process training (`torchrun --nproc_per_node=N -m tirl rl|sft ...`); ignored in a single process."""

    backend: str = "auto"  # auto = nccl when model.device is CUDA, gloo on CPU
    # FSDP2: free each decoder layer's gathered weights after its forward (less memory, one more all-gather in
    # the backward); False keeps them until the backward (ZeRO-2-like).
    reshard_after_forward: bool = True
    # how long a collective waits for the other ranks: a rank whose process dies is seen at once (its sockets
    # close), a machine that vanishes (power, network) only after this; long enough for a step's rollouts
    timeout_s: float = 1800.0

    def __post_init__(self) -> None:
        check_range("dist.timeout_s", self.timeout_s, 0, low_open=True)
        if self.backend not in BACKENDS:
            raise ValueError(f"unknown dist.backend {self.backend!r}; valid: {', '.join(BACKENDS)}")
