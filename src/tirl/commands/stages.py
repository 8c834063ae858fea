"""The stages a user runs from the CLI (SFT, RL, evaluation), each from a config and a model directory.

Each stage writes into its own output directory: the resolved config, metrics, and its result (checkpoint or
evaluation records). The demo chains them; `tirl sft|rl|eval` run one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from tirl.chat.template import ChatRenderer, format_mismatch
from tirl.commands.run_config import TirlConfig
from tirl.core.config import save_config
from tirl.core.logging import MetricsLogger, console
from tirl.data import read_rows
from tirl.data.recipe_prompts import rewrite_prompts
from tirl.data.records import ProblemRow, read_problems
from tirl.eval.evaluate import evaluate, render_generations, summarize_records, write_eval
from tirl.models.hub import ResolvedModel, resolve_model
from tirl.models.loading import check_device, load_for_inference, load_policy, load_tokenizer
from tirl.models.lora import is_lora, parameter_counts
from tirl.rollout import factory
from tirl.rollout.agent.loop import AgentLoop
from tirl.sandbox import build_sandbox
from tirl.sandbox.health import check_sandbox
from tirl.sandbox.types import Sandbox
from tirl.tasks import Task, load_task
from tirl.train import checkpoint, dist, fsdp
from tirl.train.allocator import bound_onednn_caches, keep_freed_memory
from tirl.train.manifest import RunIdentity, data_fingerprint
from tirl.train.resume import resume_point
from tirl.train.rl import reference
from tirl.train.rl.check import check_rl, sampling_of
from tirl.train.rl.run import assemble
from tirl.train.rl.trainer import RLTrainer
from tirl.train.sft import SFTConfig, SFTTrainer, sft_run


def setup_torch(cfg: TirlConfig) -> None:
    """Seeds, threads, the allocator and oneDNN's caches (`tirl.train.allocator`); under torchrun the cores are
    shared among the machine's processes (threads=0). A model.device this machine cannot use fails here."""
    check_device(cfg.model.device)
    keep_freed_memory()
    bound_onednn_caches()
    torch.manual_seed(cfg.seed)
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    torch.set_num_threads(cfg.threads or max(1, (os.cpu_count() or 1) // local))


def current_task(cfg: TirlConfig) -> Task:
    """The run's task (`task.name`: a registered name or package.module:attribute)."""
    return load_task(cfg.task.name)


def build_renderer(tokenizer: Any, cfg: TirlConfig, task: Task | None = None) -> ChatRenderer:
    """The chat renderer, listing the task's tools in the system turn (Qwen formats)."""
    task = task or current_task(cfg)
    return ChatRenderer(
        tokenizer,
        system_prompt=cfg.chat.system_prompt or task.system_prompt or None,
        fmt=cfg.chat.format,
        tools=task.toolset().schemas,
        enable_thinking=cfg.chat.enable_thinking,
        tool_format=cfg.chat.tool_format,
        history=cfg.chat.history,
    )


def task_rows(cfg: TirlConfig, path: str, split: str) -> list[dict[str, Any]]:
    """The stage's data file when set, else the task's own rows (dicts: the verl prompt rewrite and the resume
    fingerprint read them as rows)."""
    return read_rows(path) if path else current_task(cfg).load_rows(split, cfg.task, cfg.seed)


def build_agent(
    model: torch.nn.Module,
    tokenizer: Any,
    cfg: TirlConfig,
    sandbox: Sandbox,
    *,
    model_path: str | Path = "",
    work_dir: str | Path | None = None,
) -> AgentLoop:
    """The task's renderer and tools around `tirl.rollout.factory.build_agent`'s engine and loop; the caller closes
    `agent.engine` (a server engine's process)."""
    task = current_task(cfg)
    renderer = build_renderer(tokenizer, cfg, task)
    # chat.history=per_turn with a template that re-renders history: refused before an engine starts
    renderer.require_one_stream("sampling for RL, evaluation or tirl data sample")
    return factory.build_agent(
        cfg.rollout, cfg.agent, model=model, tokenizer=tokenizer, renderer=renderer,
        sandbox=sandbox, tools=task.toolset(), dtype=cfg.model.dtype, autocast=cfg.model.autocast_dtype(model.config.hidden_size),
        model_path=model_path, work_dir=work_dir,
    )  # fmt: skip


def _model(cfg: TirlConfig, model_path: str | Path | None) -> ResolvedModel:
    """`model_path` (or model.path) as a directory: itself, or a Hub id's cached snapshot with its commit."""
    path = str(model_path or cfg.model.path)
    if not path:
        raise ValueError(
            "no model: set model.path=DIR (a Hugging Face model directory, or a Hub id org/name)"
        )
    return resolve_model(path)


def recorded(cfg: TirlConfig, model: ResolvedModel) -> TirlConfig:
    """`cfg` with model.path as the run records it: `org/name@<commit>` for a Hub id, the directory as given."""
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, path=model.label))


def warn_chat_format(tokenizer: Any, model: torch.nn.Module, cfg: TirlConfig) -> None:
    """Say so when chat.format likely does not match the model's template (`tirl plan` notes the same)."""
    model_type = getattr(getattr(model, "config", None), "model_type", "") or ""
    template = getattr(tokenizer, "chat_template", None)
    note = format_mismatch(
        cfg.chat.format, model_type=model_type, chat_template=template if isinstance(template, str) else None
    )
    if note:
        console.print(f"[yellow]warning:[/] {note}")


def _policy(cfg: TirlConfig, path: str) -> torch.nn.Module:
    """The trained model (with a fresh LoRA adapter when model.lora.rank > 0), its trainable share printed."""
    model = load_policy(cfg.model, path)
    if is_lora(model):
        trainable, total = parameter_counts(model)
        console.print(
            f"LoRA rank {cfg.model.lora.rank}: {trainable:,} trainable parameters of {total:,} "
            f"({100 * trainable / total:.2f}%)"
        )
    return model


def _logger(
    cfg: TirlConfig, out: Path, state: dict[str, Any] | None, resume: str | None, **kw: Any
) -> MetricsLogger | None:
    """Rank 0's metrics logger, continuing the resumed run's step count and wandb run; None on other ranks. A
    `--resume auto` with no checkpoint to continue starts at step 0: what the earlier attempt logged is dropped."""
    if not dist.is_main():
        return None
    resumed = {"resume_step": state["step"], "run_id": state.get("wandb_id")} if state else {}
    if state is None and resume == "auto":
        resumed = {"resume_step": 0}
    return MetricsLogger(out, backends=cfg.logging.backends, **resumed, **kw)


def run_identity(
    kind: str,
    section: Any,
    seed: int,
    rows: Sequence[dict[str, Any]],
    allow: bool,
    model: ResolvedModel | None = None,
) -> RunIdentity:
    """The stage and the settings (of `section`, cfg.rl or cfg.sft) that a resume of this run must keep: they
    fix what step k trains on; a Hub model's `org/name@<commit>` too (a branch that moved is another model)."""
    keys = (
        ("n", "prompts_per_step", "mini_batch_size", "ppo_epochs")
        if kind == "rl"
        else ("epochs", "batch_size")
    )
    settings = {f"{kind}.{k}": getattr(section, k) for k in keys}
    if model is not None and model.from_hub:
        settings["model"] = model.label
    return RunIdentity(kind, {"data": data_fingerprint(rows), **settings, "seed": seed}, allow)


def run_sft(
    cfg: TirlConfig,
    out_dir: str | Path,
    *,
    model_path: str | Path | None = None,
    rows: Sequence[dict[str, Any]] | None = None,
    stage: SFTConfig | None = None,
    label: str = "SFT",
    resume: str | None = None,
    allow_changes: bool = False,
    restart: bool = False,
) -> Path:
    """SFT from `model_path` (or model.path) on sft.data (or `stage`'s data); returns the checkpoint directory.

    `resume`: a checkpoint directory, or "auto" (the newest complete one in `out_dir`; a fresh start if none); it
    must be an SFT checkpoint with this run's data and settings, unless `allow_changes`. A run that does not
    continue `out_dir`'s checkpoints is refused where an earlier run left its outputs, unless `restart` (they are
    deleted first)."""
    out = Path(out_dir)
    stage = stage or cfg.sft
    rows = rows if rows is not None else read_rows(stage.data)
    resolved = _model(cfg, model_path)
    identity = run_identity("sft", stage, cfg.seed, rows, allow_changes, resolved)
    ckpt, state = resume_point(resume, out, identity, "sft", restart)
    if dist.is_main():
        save_config(recorded(cfg, resolved) if resolved.from_hub else cfg, out / "config.yaml")
    path = str(resolved.path)
    tokenizer = load_tokenizer(path)
    model = fsdp.shard(_policy(cfg, path), reshard_after_forward=cfg.dist.reshard_after_forward)
    warn_chat_format(tokenizer, model, cfg)
    renderer = build_renderer(tokenizer, cfg)
    logger = _logger(cfg, out, state, resume)
    with contextlib.closing(logger) if logger else contextlib.nullcontext():
        trainer = SFTTrainer(sft_run(
            model, renderer, rows, stage, pad_id=renderer.pad_id, seed=cfg.seed, logger=logger, label=label,
            out_dir=out, autocast=cfg.model.autocast_dtype(model.config.hidden_size), activation_gib=cfg.model.activation_gib,
            identity=identity,
        ))  # fmt: skip
        _restore(trainer, ckpt, state)
        trainer.train()
    return fsdp.save_model(model, tokenizer, out / "model")


def run_rl(
    cfg: TirlConfig,
    out_dir: str | Path,
    *,
    model_path: str | Path | None = None,
    rows: Sequence[dict[str, Any] | ProblemRow] | None = None,
    resume: str | None = None,
    allow_changes: bool = False,
    restart: bool = False,
) -> Path:
    """GRPO-TCR from `model_path` on rl.data; returns the final checkpoint directory.

    `resume`: a checkpoint directory, or "auto" (the newest complete one in `out_dir`; a fresh start if none). The
    model is loaded from `model_path` first (it is the KL reference) and the checkpoint's weights replace the
    policy's, so a resumed run never takes its resumed policy as the reference. The checkpoint must be an RL
    checkpoint with this run's data and settings, unless `allow_changes`. `restart`: as `run_sft`'s."""
    sampling = sampling_of(cfg.rollout)
    check_rl(cfg.rl, cfg.rollout, dist.world_size(), cfg.agent.program)  # before anything loads
    out = Path(out_dir)
    rows = rows if rows is not None else task_rows(cfg, cfg.rl.data, "train")
    if cfg.rl.prompt_rewrite == "verl":
        rows = rewrite_prompts(rows, where=cfg.rl.data or "the task's RL rows")
    resolved = _model(cfg, model_path)
    identity = run_identity("rl", cfg.rl, cfg.seed, rows, allow_changes, resolved)
    ckpt, state = resume_point(resume, out, identity, "rl", restart)
    if dist.is_main():
        save_config(recorded(cfg, resolved) if resolved.from_hub else cfg, out / "config.yaml")
    path = str(resolved.path)
    check_sandbox(cfg.sandbox)  # a broken sandbox fails here, not as a model that never solves anything
    tokenizer, model, ref = _rl_policy(cfg, path)
    keys = ("reward/mean", "reward/accuracy", "rollout/tool_calls_per_response", "loss/clipfrac", "time/step")
    logger = _logger(cfg, out, state, resume, console_keys=keys, config=asdict(cfg))
    closing = contextlib.closing(logger) if logger else contextlib.nullcontext()
    with build_sandbox(cfg.sandbox) as sandbox, closing, contextlib.ExitStack() as stack:
        agent = build_agent(model, tokenizer, cfg, sandbox, model_path=path, work_dir=out)
        stack.callback(agent.engine.close)
        stack.callback(agent.close)  # an agent program's endpoint
        validate = None
        if cfg.rl.validation.data and (cfg.rl.validation.every or cfg.rl.validation.at_start):
            validate = validator(cfg, out, agent, resolved.label, logger=logger)
        run = assemble(
            model, tokenizer, agent, rows, cfg.rl, sampling=sampling, reward=cfg.reward, out_dir=out, seed=cfg.seed,
            autocast=cfg.model.autocast_dtype(model.config.hidden_size), ref_dtype=cfg.model.reference_dtype,
            ref_model=ref, activation_gib=cfg.model.activation_gib, logger=logger, ref_source=resolved.label,
            identity=identity, validate=validate,
            compile_pad_multiple=cfg.model.compile_pad_multiple if cfg.model.compile_layers else 0,
        )  # fmt: skip
        trainer = RLTrainer(run)
        _restore(trainer, ckpt, state, of=cfg.rl.steps)
        if trainer.run.validate is not None and cfg.rl.validation.at_start and trainer.step_done == 0:
            _validate_at_start(trainer, logger)
        trainer.train()
    if dist.is_main():
        _write_curves(out)
    return out / "model"


def _write_curves(out: Path) -> None:
    """The run's curves (`tirl.eval.curves`) beside its metrics, once the last step is logged."""
    from tirl.eval.curves import write_curves

    written = write_curves(out)
    if written is None:
        console.print(f"no curves: {out} has no metrics.jsonl (logging.backends without jsonl)")
    else:
        console.print(f"curves: {written[1]} (series in {written[0]})", soft_wrap=True)


def _restore(trainer: Any, ckpt: Path | None, state: dict[str, Any] | None, of: int | None = None) -> None:
    """The one restore sequence of both trainers: say how micro-batches are sized, then, resuming, put the
    checkpoint's weights, optimizer and counters back."""
    console.print(trainer.run.micro_budget.describe())
    if ckpt:
        checkpoint.restore_trainer(trainer, ckpt, state)
        total = f" of {of}" if of else ""
        # soft_wrap: a path the console's width would cut
        console.print(f"resuming from {ckpt} at step {trainer.step_done}{total}", soft_wrap=True)


def _rl_policy(cfg: TirlConfig, path: Path) -> tuple[Any, torch.nn.Module, Any]:
    """(tokenizer, the policy sharded over the processes, the KL reference or None): the reference is copied
    before sharding, so it holds the unsharded starting weights (or a pre-sharded copy of them)."""
    tokenizer = load_tokenizer(path)
    model, reshard = _policy(cfg, path), cfg.dist.reshard_after_forward
    warn_chat_format(tokenizer, model, cfg)
    ref = None
    if cfg.rl.kl.coef > 0:
        ref = reference.copy_before_sharding(model, cfg.model.reference_dtype, reshard_after_forward=reshard)
    return tokenizer, fsdp.shard(model, reshard_after_forward=reshard), ref


def _validate_at_start(trainer: RLTrainer, logger: MetricsLogger | None) -> None:
    """The starting policy's validation numbers, logged as step 0, before any update."""
    with fsdp.gathered(trainer.run.policy):
        val = trainer.run.validate(0)
    if logger:
        logger.log(val, step=0)


def eval_reward(cfg: TirlConfig):
    """The reward settings evaluation grades with: the run's grading and code-test timeout, no shaping."""
    from tirl.rewards.shaping import RewardConfig

    return RewardConfig(grading=cfg.reward.grading, code_timeout_s=cfg.reward.code_timeout_s)


def validator(cfg: TirlConfig, out: Path, agent: AgentLoop, model_path: str, *, logger: Any = None):
    """step -> `val/<data_source>/<metric>` of the current policy on rl.validation.data (eval.n samples each), and
    `val/after_step`: the RL steps done (0: the starting policy). The problems are the first eval.max_problems
    rows of the files (0: all), the same slice every time, as is each evaluation's seed; each evaluation's records go
    to OUT/eval/step-<k>/, where `tirl analyze` reads them, and the first eval.log_generations generations to the
    logger's text log."""
    # read now: a bad file fails at start-up; sliced before the ranks share it, so every rank count sees one slice
    rows = [row for f in cfg.rl.validation.data for row in read_problems(f)][: cfg.eval.max_problems or None]
    eval_cfg = dataclasses.replace(cfg.eval, max_problems=0)
    conf = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, path=model_path))  # its tokenizer

    def validate(step: int) -> dict[str, float]:
        # under torchrun each rank evaluates its share of the rows; rank 0 writes them all
        mine = dist.rank_share(rows)
        parts = dist.all_gather_objects(
            evaluate(
                agent,
                mine,
                eval_cfg,
                model_label=f"step-{step}",
                seed=dist.rank_seed(cfg.seed),
                reward=eval_reward(cfg),
            )
        )
        records, trajs = [r for p in parts for r in p[0]], [t for p in parts for t in p[1]]
        summary = summarize_records(records, cfg.eval.ks)
        where = out / "eval" / f"step-{step:06d}"
        if dist.is_main():
            write_eval(where, records, trajs, summary)
            save_config(conf, where / "config.yaml")
        if logger is not None and cfg.eval.log_generations:
            text = render_generations(trajs, agent.renderer.tokenizer, cfg.eval.log_generations)
            logger.log_text("val/generations", text, step=step)
        val = {f"val/{src}/{k}": float(v) for src, m in summary.items() for k, v in m.items() if "@" in k}
        return {**val, "val/after_step": float(step)}

    return validate


@contextlib.contextmanager
def inference_agent(cfg: TirlConfig, model_path: str | Path | None, work_dir: Path) -> Iterator[AgentLoop]:
    """The agent `tirl eval` and `tirl data sample` sample with: the model loaded for inference (a LoRA adapter
    merged onto its base), the run's engine and a live sandbox, both closed when the block ends."""
    path = str(_model(cfg, model_path).path)
    check_sandbox(cfg.sandbox)  # before the model loads: a broken sandbox would score it 0
    tokenizer = load_tokenizer(path)
    model = load_for_inference(cfg.model, path)
    warn_chat_format(tokenizer, model, cfg)
    with build_sandbox(cfg.sandbox) as sandbox:
        agent = build_agent(model, tokenizer, cfg, sandbox, model_path=path, work_dir=work_dir)
        with contextlib.closing(agent.engine), contextlib.closing(agent):
            yield agent


def run_eval(
    cfg: TirlConfig,
    out_dir: str | Path,
    *,
    model_path: str | Path | None = None,
    label: str = "model",
    rows: Sequence[dict[str, Any] | ProblemRow] | None = None,
) -> dict[str, dict[str, float]]:
    """n samples per problem of eval.data; writes records, trajectories and summary; returns the summary."""
    out = Path(out_dir)
    resolved = _model(cfg, model_path)
    # the model actually evaluated (a Hub id with its commit), so `tirl analyze` finds its tokenizer
    save_config(recorded(cfg, resolved), out / "config.yaml")
    rows = rows if rows is not None else task_rows(cfg, cfg.eval.data, "test")
    with inference_agent(cfg, resolved.path, out) as agent:
        records, trajs = evaluate(
            agent, rows, cfg.eval, model_label=label, seed=cfg.seed, reward=eval_reward(cfg)
        )
    summary = summarize_records(records, cfg.eval.ks)
    write_eval(out, records, trajs, summary)
    return summary
