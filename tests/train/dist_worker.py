"""Run by tests/train/test_dist.py under `torchrun --nproc_per_node=2`; its functions also run in the test's own
process, as the single-process reference.

`dist_worker.py OUT MODEL_DIR SFT_DATA` does three things, writing its results under OUT (rank 0):
1. `rl_update`: one RL update (the trainer's own `_update`, with KL, entropy, and a token budget that gives the
   ranks different numbers of micro-batches) on a fixed batch of 8 trajectories, each rank taking its half, for
   full training and for a LoRA adapter; statistics and parameters before and after the update go to
   update-<full|lora>-<world>.pt.
2. `gradient_reduction`: the gradient of one backward against a single-process gradient computed in every
   process, for tirl's sharding (SUM over ranks of globally normalized losses) and for FSDP2's default (AVG, the
   path of pytorch issue 162338); the largest differences go to grads.json.
3. `run_sft` on SFT_DATA from MODEL_DIR into sft-<world>/ (batches of 5 over 2 ranks: uneven shares, and a last
   batch of one row that leaves rank 1 nothing but idle passes).
"""

from __future__ import annotations

import copy
import json
import os
import sys
from pathlib import Path

if (
    __name__ == "__main__"
):  # a CPU run under torchrun; imported (test_dist), it must not hide a GPU from pytest
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # conftest's tiny tokenizer and model

import torch  # noqa: E402

from conftest import build_test_tokenizer, make_agent, make_model  # noqa: E402
from tirl.chat.template import ChatRenderer  # noqa: E402
from tirl.commands.run_config import LoggingConfig, TirlConfig  # noqa: E402
from tirl.commands.stages import run_sft  # noqa: E402
from tirl.data import read_rows  # noqa: E402
from tirl.models.loading import ModelConfig  # noqa: E402
from tirl.rewards.shaping import RewardConfig  # noqa: E402
from tirl.rollout.sampling import SamplingParams  # noqa: E402
from tirl.tasks.arith.problems import generate_problems  # noqa: E402
from tirl.train import dist, fsdp  # noqa: E402
from tirl.train.batch import collate  # noqa: E402
from tirl.train.logprobs import token_logprobs  # noqa: E402
from tirl.train.optim import OptimConfig  # noqa: E402
from tirl.train.rl.config import KLConfig  # noqa: E402
from tirl.train.rl.run import assemble
from tirl.train.rl.trainer import RLConfig, RLTrainer  # noqa: E402
from tirl.train.sft import SFTConfig  # noqa: E402

B = 8


def fixed_batch(vocab: int, pad_id: int, rows: slice):
    """8 trajectories: a 5-token prompt, then sampled tokens with a tool-output gap. The first half is long, the
    second short: with a 60-token micro-batch budget, rank 0 needs 2 passes and rank 1 one (plus an idle one)."""
    g = torch.Generator().manual_seed(123)
    lengths = [30, 28, 26, 24, 9, 10, 11, 12]
    ids, masks, adv = [], [], []
    for b, n in enumerate(lengths):
        ids.append(torch.randint(1, vocab, (n,), generator=g).tolist())
        m = [0] * 5 + [1] * (n - 5)
        if n > 12:
            m[8:11] = [0, 0, 0]
        masks.append(m)
        adv.append([float(torch.randn((), generator=g))] * n)
        del b
    return collate(ids[rows], masks[rows], pad_id=pad_id, extra={"advantages": adv[rows]})


def _params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The whole model's weights (gathered to rank 0 when sharded), copied."""
    state = fsdp.full_state_dict(model) if fsdp.is_sharded(model) else model.state_dict()
    return {k: v.detach().clone() for k, v in state.items()}


def rl_update(out: Path, lora_rank: int = 0) -> None:
    """With `lora_rank` > 0, a LoRA adapter (B drawn at random, so A has a gradient too) trains and KL is off
    (the adapter-disabled reference belongs to the LoRA work)."""
    tok = build_test_tokenizer()
    renderer = ChatRenderer(tok)
    model = make_model(tok).train()
    ref = copy.deepcopy(model)
    if lora_rank:
        from tirl.models.lora import LoraConfig, apply_lora

        model = apply_lora(model, LoraConfig(rank=lora_rank))
        g = torch.Generator().manual_seed(5)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0.0, 0.05, generator=g)
    if dist.is_distributed():
        fsdp.shard_model(ref)
        fsdp.shard_model(model)
    before = _params(model)
    cfg = RLConfig(
        prompts_per_step=2,
        n=4,
        mini_batch_size=B,
        micro_batch_tokens=60,
        kl=KLConfig(coef=0.0 if lora_rank else 0.05),
        entropy_coef=0.01,
        # AdamW's first step is about lr * sign(g) for the default eps, blind to a wrong gradient scale and
        # jumpy where g is near 0; an eps near the gradients' size makes the step follow the gradient itself
        optim=OptimConfig(lr=0.01, weight_decay=0.01, grad_clip=1.0, eps=1e-3),
    )
    trainer = RLTrainer(
        assemble(
            model,
            tok,
            make_agent(model, renderer, None, 16),
            [p.to_row() for p in generate_problems(4, seed=0)],
            cfg,
            sampling=SamplingParams(),
            reward=RewardConfig(),
            out_dir=out / f"rl-{dist.world_size()}",
            seed=0,
            ref_model=ref,
        )
    )
    half = B // dist.world_size()
    batch = fixed_batch(
        model.config.vocab_size, renderer.pad_id, slice(dist.rank() * half, (dist.rank() + 1) * half)
    )
    ref_logp = None
    if trainer.run.reference is not None:
        with trainer.run.reference.model() as reference:
            ref_logp = trainer._logprobs(reference, batch)
    stats = trainer._update(batch, None, ref_logp)
    params = _params(model)
    if dist.is_main():
        name = f"update-{'lora' if lora_rank else 'full'}-{dist.world_size()}.pt"
        torch.save({"stats": stats, "params": params, "before": before}, out / name)


def _grad_max_diff(sharded: torch.nn.Module, reference: torch.nn.Module) -> float:
    return max(
        float((p.grad.full_tensor() - q.grad).abs().max())
        for p, q in zip(sharded.parameters(), reference.parameters(), strict=True)
    )


def gradient_reduction(out: Path) -> None:
    """Largest |gradient - single-process gradient| for tirl's SUM reduction and FSDP2's default AVG on gloo."""
    from torch.distributed.fsdp import fully_shard

    tok = build_test_tokenizer()
    model = make_model(tok, seed=1).train()
    batch = fixed_batch(model.config.vocab_size, 0, slice(0, B))

    def loss_of(m: torch.nn.Module, rows: slice, denom: float) -> torch.Tensor:
        lp, _ = token_logprobs(
            m, batch.input_ids[rows], batch.attention_mask[rows], loss_mask=batch.loss_mask[rows]
        )
        return -lp.sum() / denom

    reference = copy.deepcopy(model)
    total = float(batch.loss_mask[:, 1:].sum())
    loss_of(reference, slice(0, B), total).backward()  # the whole batch's token-mean loss, one process
    half, r = B // dist.world_size(), dist.rank()
    mine = slice(r * half, (r + 1) * half)

    ours = fsdp.shard_model(copy.deepcopy(model))
    loss_of(ours, mine, total).backward()  # local sum over the global count; gradients summed over ranks

    default = copy.deepcopy(model)
    for layer in default.model.layers:
        fully_shard(layer)
    fully_shard(default)  # FSDP2's own choice: AVG on gloo (fp32)
    # an average over ranks of (world x the local part) is again the whole batch's gradient
    (dist.world_size() * loss_of(default, mine, total)).backward()
    diffs = {
        "tirl_sum": _grad_max_diff(ours, reference),
        "fsdp_default_avg": _grad_max_diff(default, reference),
    }
    if dist.is_main():
        (out / "grads.json").write_text(json.dumps(diffs))


def sft(out: Path, model_dir: str, data: str) -> None:
    cfg = TirlConfig(
        model=ModelConfig(path=model_dir),
        sft=SFTConfig(epochs=1, batch_size=5, micro_batch_size=2, optim=OptimConfig(lr=0.01, eps=1e-3)),
        logging=LoggingConfig(backends=["jsonl"]),
    )
    run_sft(cfg, out / f"sft-{dist.world_size()}", rows=read_rows(data))


def main() -> None:
    out, model_dir, data = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    torch.set_num_threads(1)
    dist.init_distributed(dist.DistConfig(backend="gloo"), "cpu")
    try:
        rl_update(out)
        rl_update(out, lora_rank=4)
        gradient_reduction(out)
        sft(out, model_dir, data)
    finally:
        dist.shutdown()


if __name__ == "__main__":
    main()
