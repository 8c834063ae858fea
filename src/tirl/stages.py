"""The stages a user runs from the CLI (SFT, RL, evaluation), each from a config and a model directory.

Each stage writes into its own output directory: the resolved config, metrics, and its result (checkpoint or
evaluation records). The demo chains them; `tirl sft|rl|eval` run one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from tirl.chat.template import ChatRenderer
from tirl.config import save_config
from tirl.data import read_rows
from tirl.eval.evaluate import evaluate, summarize_records, write_eval
from tirl.logging import MetricsLogger
from tirl.models.loading import load_model, load_tokenizer, save_checkpoint
from tirl.rollout.agent import AgentLoop, stop_token_ids
from tirl.rollout.engine import TorchEngine
from tirl.rollout.sampling import SamplingParams
from tirl.run_config import TirlConfig
from tirl.sandbox import build_sandbox
from tirl.sandbox.types import Sandbox
from tirl.tasks import Task, load_task
from tirl.tools import CodeInterpreter
from tirl.train.rl import RLTrainer
from tirl.train.sft import SFTConfig, train_sft


def setup_torch(cfg: TirlConfig) -> None:
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.threads or os.cpu_count() or 1)


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
    )


def _task_rows(cfg: TirlConfig, path: str, split: str) -> list[dict[str, Any]]:
    """The stage's data file when set, else the task's own rows."""
    return read_rows(path) if path else current_task(cfg).load_rows(split, cfg)


def build_agent(model: torch.nn.Module, tokenizer: Any, cfg: TirlConfig, sandbox: Sandbox) -> AgentLoop:
    task = current_task(cfg)
    renderer = build_renderer(tokenizer, cfg, task)
    engine = TorchEngine(
        model,
        eos_ids=[renderer.eos_id],
        pad_id=renderer.pad_id,
        stop_ids=stop_token_ids(renderer, cfg.agent),
        max_batch_size=cfg.rollout.max_batch_size,
    )
    tools = task.toolset()
    for name, t in tools.tools.items():  # agent.auto_print configures the code interpreter of any task
        if isinstance(t, CodeInterpreter) and t.auto_print != cfg.agent.auto_print:
            tools.tools[name] = CodeInterpreter(auto_print=cfg.agent.auto_print)
    return AgentLoop(engine, renderer, sandbox, cfg.agent, tools=tools)


def _model_path(cfg: TirlConfig, model_path: str | Path | None) -> str:
    path = str(model_path or cfg.model.path)
    if not path:
        raise ValueError("no model: set model.path=DIR (a Hugging Face model directory)")
    return path


def run_sft(
    cfg: TirlConfig,
    out_dir: str | Path,
    *,
    model_path: str | Path | None = None,
    rows: Sequence[dict[str, Any]] | None = None,
    stage: SFTConfig | None = None,
    label: str = "SFT",
) -> Path:
    """SFT from `model_path` (or model.path) on sft.data (or `stage`'s data); returns the checkpoint directory."""
    out = Path(out_dir)
    save_config(cfg, out / "config.yaml")
    path = _model_path(cfg, model_path)
    stage = stage or cfg.sft
    rows = rows if rows is not None else read_rows(stage.data)
    tokenizer = load_tokenizer(path)
    model = load_model(cfg.model, path)
    renderer = build_renderer(tokenizer, cfg)
    logger = MetricsLogger(out, backends=cfg.logging.backends)
    try:
        train_sft(
            model,
            renderer,
            rows,
            stage,
            pad_id=renderer.pad_id,
            seed=cfg.seed,
            logger=logger,
            label=label,
        )
    finally:
        logger.close()
    return save_checkpoint(model, tokenizer, out / "model")


def run_rl(
    cfg: TirlConfig,
    out_dir: str | Path,
    *,
    model_path: str | Path | None = None,
    rows: Sequence[dict[str, Any]] | None = None,
) -> Path:
    """GRPO-TCR from `model_path` on rl.data; returns the final checkpoint directory."""
    out = Path(out_dir)
    save_config(cfg, out / "config.yaml")
    path = _model_path(cfg, model_path)
    rows = rows if rows is not None else _task_rows(cfg, cfg.rl.data, "train")
    tokenizer = load_tokenizer(path)
    model = load_model(cfg.model, path)
    sampling = SamplingParams(
        temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p, top_k=cfg.rollout.top_k
    )
    keys = ("reward/mean", "reward/accuracy", "rollout/tool_calls", "loss/clipfrac", "time/step")
    logger = MetricsLogger(out, backends=cfg.logging.backends, console_keys=keys, config=asdict(cfg))
    with build_sandbox(cfg.sandbox) as sandbox, contextlib.closing(logger):
        agent = build_agent(model, tokenizer, cfg, sandbox)
        trainer = RLTrainer(
            model,
            tokenizer,
            agent,
            rows,
            cfg.rl,
            sampling=sampling,
            reward=cfg.reward,
            out_dir=out,
            seed=cfg.seed,
            logger=logger,
        )
        trainer.train()
    return out / "model"


def run_eval(
    cfg: TirlConfig,
    out_dir: str | Path,
    *,
    model_path: str | Path | None = None,
    label: str = "model",
    rows: Sequence[dict[str, Any]] | None = None,
) -> dict[str, dict[str, float]]:
    """n samples per problem of eval.data; writes records, trajectories and summary; returns the summary."""
    out = Path(out_dir)
    path = _model_path(cfg, model_path)
    # the model actually evaluated, so `tirl analyze` finds its tokenizer
    save_config(
        dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, path=str(path))), out / "config.yaml"
    )
    rows = rows if rows is not None else _task_rows(cfg, cfg.eval.data, "test")
    tokenizer = load_tokenizer(path)
    model = load_model(cfg.model, path).eval()
    with build_sandbox(cfg.sandbox) as sandbox:
        agent = build_agent(model, tokenizer, cfg, sandbox)
        records, trajs = evaluate(agent, rows, cfg.eval, model_label=label, seed=cfg.seed)
    summary = summarize_records(records, cfg.eval.ks)
    write_eval(out, records, trajs, summary)
    return summary
