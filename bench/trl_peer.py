"""Hugging Face TRL's GRPOTrainer as a peer of `tirl rl` in bench/rl_step.py: same model, prompts and shape, timed.

Run by `.venv-trl/bin/python` (TRL is a benchmark peer, never a tirl dependency: this file imports only
trl/transformers/torch/datasets and the standard library). `--prompts FILE` is a JSON list of {"text", "answer"}:
the chat-templated prompt texts tirl's first steps sample (bench/rl_step.py writes them with tirl's own renderer),
fed to TRL as plain-text prompts, `--per-step` per step in order (no shuffling), so TRL's step N sees tirl's prompts.

Settings, each mirroring `tirl rl` at the bench's shape where TRL has one:
- `num_generations=n` (8) completions of `max_completion_length` (64) tokens at temperature 1.0, top_p 1.0, from
  `transformers` `generate` (`use_vllm=False`), single-turn (TRL runs no tool here; the base model rarely calls one);
- one optimizer step per generation batch of per_step x n (64) completions: `gradient_accumulation_steps =
  64 / --micro-batch` and `per_device_train_batch_size = --micro-batch`, so `steps_per_generation` (its default,
  the accumulation steps) makes TRL generate once per step and compute no old log-probs (on-policy, like tirl's
  single update per step); `--micro-batch 64` is one forward/backward over the whole batch;
- `loss_type="dapo"` (TRL's default): token losses summed over the accumulated batch and divided by its number of
  completion tokens: tirl's `loss_agg: token-mean`; `epsilon=0.2`, `epsilon_high=0.28` (tirl's clip_low/high);
- `beta=0` (no reference model, as GRPO-TCR), `num_iterations=1`, learning rate 1e-6 (constant, no weight decay),
  grad clip 1.0; TRL's optimizer is transformers' default `adamw_torch_fused`;
- fp32 by default (`bf16=False`: GRPOConfig defaults to bf16=True); `--bf16`: accelerate's bf16 autocast over
  fp32 weights, as tirl's `model.autocast: auto` on a CPU with AVX512-BF16;
- gradient checkpointing on: TRL's default (tirl's is off); `--no-gradient-checkpointing` turns it off.
Reward: +1 for a last `\\boxed{N}` equal to the answer, else -1 (tirl's scale; the base model scores -1 throughout).

Per step: the wall time from `on_step_begin` to `on_step_end` (generation included: TRL generates inside the first
micro-step), `_generate_single_turn` (the `generate` call), `_generate_and_score_completions` (generation, reward,
advantages: tirl's `time/rollout`), their difference from the step (tirl's `perf/step_s/update`) and the process's
peak RSS (ru_maxrss, as tirl's `perf/peak_rss_mb`). The last step's numbers are reported (the first pays for
one-time work). Prints one JSON line.
"""

# ruff: noqa: E402
from __future__ import annotations

import os

# a CPU peer, even where a GPU is visible: set before torch loads
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import argparse
import json
import re
import resource
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch
import transformers
import trl
from datasets import Dataset
from transformers import PrinterCallback, TrainerCallback
from trl import GRPOConfig, GRPOTrainer

BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
LOG_KEYS = ("reward", "loss", "entropy", "completions/mean_length", "completions/clipped_ratio", "step_time")


def peak_rss_mb() -> float:
    """This process's peak resident memory so far (ru_maxrss: KiB on Linux, bytes on macOS)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / (1024 * 1024 if sys.platform == "darwin" else 1024)


def correct(prompts: list, completions: list, answer: list, **_: object) -> list[float]:
    """+1 where the last \\boxed{} holds the answer, else -1."""
    out = []
    for text, truth in zip(completions, answer, strict=True):
        boxed = BOXED.findall(text)
        out.append(1.0 if boxed and boxed[-1].strip().replace(",", "") == str(truth) else -1.0)
    return out


class TimedGRPO(GRPOTrainer):
    """GRPOTrainer timing its generation and its rollout phase (generation, rewards, advantages) per step."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.timed: dict[str, float] = defaultdict(float)
        self.seen: list[int] = []  # dataset indices generated from this step

    def _generate_single_turn(self, *args: object, **kwargs: object):
        t0 = time.perf_counter()
        out = super()._generate_single_turn(*args, **kwargs)
        self.timed["generate_s"] += time.perf_counter() - t0
        return out

    def _generate_and_score_completions(self, inputs: list):
        t0 = time.perf_counter()
        out = super()._generate_and_score_completions(inputs)
        self.timed["rollout_s"] += time.perf_counter() - t0
        self.seen += sorted({int(x["index"]) for x in inputs})
        return out


class StepTimer(TrainerCallback):
    """Per optimizer step: wall time, the trainer's generation/rollout timers, peak RSS, and the logged metrics."""

    def __init__(self) -> None:
        self.trainer: TimedGRPO | None = None
        self.rows: list[dict] = []
        self.t0 = self.t_opt = 0.0

    def on_step_begin(self, args, state, control, **kwargs):
        self.trainer.timed.clear()
        self.trainer.seen = []
        self.t0 = time.perf_counter()

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self.t_opt = time.perf_counter()

    def on_optimizer_step(self, args, state, control, **kwargs):
        self.trainer.timed["optimizer_s"] += time.perf_counter() - self.t_opt

    def on_step_end(self, args, state, control, **kwargs):
        step_s = time.perf_counter() - self.t0
        timed = dict(self.trainer.timed)
        row = {"step": state.global_step, "step_s": step_s, **timed}
        row["update_s"] = step_s - timed.get("rollout_s", 0.0)
        row |= {"peak_rss_mb": peak_rss_mb(), "prompts": list(self.trainer.seen)}
        self.rows.append(row)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.rows and logs:
            self.rows[-1] |= {k: logs[k] for k in LOG_KEYS if k in logs}


def same_prompt_ids(tokenizer: object, prompts: list[dict]) -> bool | None:
    """Whether TRL's tokenization of the prompt texts (as `_tokenize_prompts` does it) gives tirl's prompt ids."""
    given = [p for p in prompts if "ids" in p]
    if not given:
        return None
    return all(tokenizer(text=p["text"])["input_ids"] == p["ids"] for p in given)


def grpo_config(args: argparse.Namespace, out_dir: str) -> GRPOConfig:
    batch = args.per_step * args.n
    if batch % args.micro_batch:
        raise SystemExit(f"--micro-batch {args.micro_batch} must divide the batch of {batch} completions")
    return GRPOConfig(
        output_dir=out_dir, use_cpu=True, bf16=args.bf16, fp16=False, seed=args.seed, data_seed=args.seed,
        num_generations=args.n, max_completion_length=args.max_tokens, temperature=1.0, top_p=1.0,
        per_device_train_batch_size=args.micro_batch, gradient_accumulation_steps=batch // args.micro_batch,
        beta=0.0, num_iterations=1, loss_type="dapo", epsilon=0.2, epsilon_high=0.28, learning_rate=1e-6,
        lr_scheduler_type="constant", weight_decay=0.0, max_grad_norm=1.0, use_vllm=False, gradient_checkpointing=args.gradient_checkpointing,
        shuffle_dataset=False, logging_steps=1, max_steps=args.steps, report_to="none", save_strategy="no",
        disable_tqdm=True, dataloader_num_workers=0,
    )  # fmt: skip


def run(args: argparse.Namespace) -> dict:
    prompts = json.loads(Path(args.prompts).read_text())[: args.per_step * args.steps]
    if len(prompts) < args.per_step * args.steps:
        raise SystemExit(
            f"{args.prompts}: {len(prompts)} prompts, {args.per_step} x {args.steps} steps needed"
        )
    data = Dataset.from_list(
        [{"prompt": p["text"], "answer": str(p["answer"]), "index": i} for i, p in enumerate(prompts)]
    )
    timer = StepTimer()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = grpo_config(args, tmp)
        trainer = TimedGRPO(
            model=args.model, reward_funcs=correct, args=cfg, train_dataset=data, callbacks=[timer]
        )
        trainer.remove_callback(PrinterCallback)  # its log lines on stdout: ours is the one JSON line there
        timer.trainer = trainer
        same_ids = same_prompt_ids(trainer.processing_class, prompts)
        t0 = time.perf_counter()
        trainer.train()
        wall = time.perf_counter() - t0
    last = timer.rows[-1]
    return {
        "peer": f"trl {trl.__version__} GRPOTrainer",
        "versions": {
            "trl": trl.__version__,
            "transformers": transformers.__version__,
            "torch": torch.__version__,
        },
        "precision": "bf16 autocast" if args.bf16 else "fp32",
        "micro_batch": args.micro_batch,
        "grad_accum": cfg.gradient_accumulation_steps,
        "gradient_checkpointing": cfg.gradient_checkpointing,
        "loss_type": cfg.loss_type,
        "threads": torch.get_num_threads(),
        "prompt_ids_match": same_ids,
        "train_wall_s": wall,
        "steps": timer.rows,
        "last": last,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompts", required=True, help="JSON list of {text, answer}")
    ap.add_argument("--per-step", type=int, default=8, help="prompts per step")
    ap.add_argument("--n", type=int, default=8, help="completions per prompt (num_generations)")
    ap.add_argument("--max-tokens", type=int, default=64, help="max_completion_length")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument(
        "--micro-batch", type=int, default=64, help="per_device_train_batch_size (64: whole batch)"
    )
    ap.add_argument("--bf16", action="store_true", help="bf16 autocast (default: fp32)")
    ap.add_argument("--no-gradient-checkpointing", dest="gradient_checkpointing", action="store_false")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(json.dumps(run(args)), flush=True)


if __name__ == "__main__":
    main()
