"""`tirl check-tokens FILE`: its parser and the command (read the file and the run's config, check, print); the
comparison itself is `tirl.chat.tokcheck`."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tirl.chat.template import ChatRenderer
from tirl.chat.tokcheck import check_rows
from tirl.data.lengths import READ_MAX_TOKENS


def _jsonl_rows(path: Path, max_length: int) -> Iterator[tuple[int, dict[str, Any]]]:
    """The file's rows; an SFT row validated as `tirl sft` reads it (a malformed one names its row and column),
    and one with more characters than `max_length` tokens can hold refused before it is rendered."""
    from tirl.data.lengths import check_row_chars
    from tirl.data.readers import iter_records
    from tirl.data.schema import RowError, SchemaError, validate_sft_row

    for num, rec in iter_records(path):
        if isinstance(rec, RowError):
            raise rec
        check_row_chars(rec, max_length, where=f"{path}: row {num}", key="--max-length")
        if "messages" in rec and "response_ids" not in rec:
            try:
                rec = validate_sft_row(rec)
            except SchemaError as e:
                raise RowError(str(path), num, e.column, e.message) from None
        yield num, rec


def _prompts_by_id(data: str) -> dict[str, Any]:
    """The prompt messages of each problem of `data`, by the problem id eval records carry."""
    from tirl.data.records import read_problems

    return {p.problem_id: p.prompt for p in read_problems(data)}


def check_tokens_command(
    file: str,
    *,
    model: str | None,
    fmt: str | None,
    config: str | None,
    data: str | None,
    strict: bool = False,
    show: int = 10,
    stream: str | None = None,
    tool_format: str | None = None,
    max_length: int = READ_MAX_TOKENS,
) -> int:
    from tirl.commands.run_config import TirlConfig
    from tirl.core.config import load_config
    from tirl.core.logging import console
    from tirl.models.loading import load_tokenizer

    path = Path(file)
    cfg_path = config or (path.parent / "config.yaml" if (path.parent / "config.yaml").is_file() else None)
    cfg = load_config(TirlConfig, cfg_path, [])
    model = model or cfg.model.path
    if not model:
        raise ValueError(
            "no tokenizer: pass --model DIR (a model or tokenizer directory) or a config with model.path"
        )
    from tirl.tasks import load_task

    task = load_task(cfg.task.name)  # its tools are listed in the system turn the rollouts started from
    renderer = ChatRenderer(
        load_tokenizer(model),
        system_prompt=cfg.chat.system_prompt or task.system_prompt or None,
        fmt=fmt or cfg.chat.format,
        tools=task.toolset().schemas,
        enable_thinking=cfg.chat.enable_thinking,
        tool_format=tool_format or cfg.chat.tool_format,
    )
    stream = stream or cfg.agent.token_stream
    res = check_rows(
        renderer, _jsonl_rows(path, max_length), _prompts_by_id(data) if data else None, stream=stream
    )
    if res.rows == 0:  # checking nothing must not pass as "no divergence"
        raise ValueError(f"{file}: no rows to check: pass a run's trajectories (JSONL) or an SFT data file")
    for d in res.divergences[:show]:
        console.print(d.describe(), markup=False, highlight=False, soft_wrap=True)
    if len(res.divergences) > show:
        console.print(f"... and {len(res.divergences) - show} more rows diverge")
    console.print(
        f"{file}: {res.rows} rows checked, {len(res.divergences)} diverge, {res.noncanonical_turns} sampled turns "
        f"with a non-canonical token split{' (fatal: --strict)' if strict else ''} "
        f"({renderer.fmt} format, {renderer.tool_format.name} tool calls, {stream} token stream, tokenizer {model})",
        soft_wrap=True,
    )
    return 0 if res.ok(strict=strict) else 1


def _cmd_check_tokens(args: argparse.Namespace) -> int:
    return check_tokens_command(
        args.file,
        model=args.model,
        fmt=args.format,
        config=args.config,
        data=args.data,
        strict=args.strict,
        stream=args.stream,
        tool_format=args.tool_format,
        max_length=args.max_length,
    )


def add_check_tokens_parser(sub: argparse._SubParsersAction) -> None:
    """`tirl check-tokens`, added to tirl's parser by cli.py."""
    from tirl.chat.template import FORMATS
    from tirl.chat.tool_formats import TOOL_FORMATS

    p = sub.add_parser("check-tokens", help="re-render rollouts or SFT rows; compare ids and loss masks")
    p.add_argument("file", help="trajectories.jsonl (tirl eval) or an SFT file")
    p.add_argument(
        "--model", default=None, help="tokenizer directory or Hub id (default: the config's model.path)"
    )
    p.add_argument("--format", choices=FORMATS, default=None, help="chat format (default: the config's)")
    p.add_argument(
        "--tool-format",
        choices=list(TOOL_FORMATS),
        default=None,
        help="tool-call format (default: the config's)",
    )
    p.add_argument("--config", default=None, help="run config (default: config.yaml next to FILE, if any)")
    p.add_argument("--data", default=None, help="the evaluated rows, for trajectories without meta.prompt")
    p.add_argument("--strict", action="store_true", help="also fail on sampled turns split non-canonically")
    p.add_argument(
        "--stream",
        choices=["tirl", "verl"],
        default=None,
        help="the rollouts' token stream before a tool turn (default: agent.token_stream of the config)",
    )
    p.add_argument(
        "--max-length",
        type=int,
        default=READ_MAX_TOKENS,
        help="refuse, before rendering it, a row with more characters than this many tokens can hold "
        f"(default {READ_MAX_TOKENS}; 0 = no limit)",
    )
    p.set_defaults(fn=_cmd_check_tokens)
