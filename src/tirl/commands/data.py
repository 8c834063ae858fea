"""`tirl data prepare`, `stitch` and `inspect`, and the `tirl data` parser (with `sample` and `filter` from their own
modules); what they run lives below: the data a task ships or reads from the user's file (`Task.prepare`: the
benchmarks in `tirl.tasks.benchmarks`, GSM8K's in `tirl.tasks.gsm8k`), the recipe's Hub datasets
(`tirl.data.hub`), the readers in `tirl.data`, stitching in `tirl.tasks.gsm8k.stitch`. The names `prepare`
offers come from the task registry (`prepared_tasks`) and the Hub table (`HUB_SETS`), never from a list here."""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path
from typing import Any

from tirl.data.benchmarks import WORDINGS
from tirl.data.lengths import READ_MAX_TOKENS
from tirl.data.readers import ReadReport, iter_rows
from tirl.tasks import Task, prepared_tasks

MAX_ERRORS_SHOWN = 20


def prepare_command(
    name: str,
    out: str,
    *,
    wording: str = "recipe",
    source: str | None = None,
    force: bool = False,
    split: str = "test",
    revision: str | None = None,
) -> int:
    """Write benchmark or Hub dataset `name` to `out`; an existing `out` (a run's data/rl.jsonl, say) is replaced
    only if `force`. A Hub dataset's provenance goes beside it (`OUT.source.json`)."""
    from tirl.core.logging import console
    from tirl.data import claim_rows_out, write_rows
    from tirl.data.hub import HUB_SETS, prepare_hub, write_record

    if name in HUB_SETS and (source is not None or split != "test"):
        raise ValueError(f"{name} is fetched from the Hub: --source and --split are for the benchmarks")
    if name not in HUB_SETS and revision is not None:
        raise ValueError(f"--revision is for the Hub datasets ({', '.join(HUB_SETS)}), not {name}")
    claim_rows_out(out, force=force)
    if name in HUB_SETS:
        rows, record = prepare_hub(name, wording=wording, revision=revision)
        path = write_rows(out, rows)
        sidecar = write_record(path, record)
        console.print(
            f"{name}: {len(rows)} {record['kind']} rows from {record['repo_id']} @ {record['commit'][:12]} "
            f"(sha256 {record['sha256'][:16]}) -> {path}, provenance in {sidecar}",
            soft_wrap=True,
        )
        return 0
    tasks = prepared_tasks()
    if wording not in WORDINGS:
        raise ValueError(f"unknown wording {wording!r}; valid: {', '.join(WORDINGS)}")
    if name not in tasks:
        raise ValueError(f"unknown dataset {name!r}; valid: {', '.join([*tasks, *HUB_SETS])}")
    rows = prepare_rows(tasks, name, wording, split, source)
    path = write_rows(out, rows)
    console.print(f"{name} {split}: {len(rows)} rows ({wording} wording) -> {path}")
    return 0


def user_file_tasks(tasks: dict[str, Task]) -> dict[str, Task]:
    """The tasks whose data is the user's file (`Task.user_file`, `--source`), by name."""
    return {k: t for k, t in tasks.items() if t.user_file}


def prepare_rows(
    tasks: dict[str, Task], name: str, wording: str, split: str, source: str | None
) -> list[dict[str, Any]]:
    """Task `name`'s rows of `split`: from the user's file for a task that reads one (its own error when `source`
    is None), else from its packaged data, which `--source` does not apply to."""
    task = tasks[name]
    if task.user_file:
        return task.prepare(wording, split, source)
    if source is not None:
        raise ValueError(
            f"{name} is packaged with tirl; --source is only for {', '.join(user_file_tasks(tasks))}"
        )
    return task.prepare(wording, split)


def stitch_command(
    out: str,
    *,
    split: str = "train",
    max_steps: int = 0,
    limit: int = 0,
    wording: str = "recipe",
    force: bool = False,
    style: str = "code",
) -> int:
    """Stitched SFT trajectories from GSM8K's annotated solutions (tasks/gsm8k/stitch.py); 1 if no row survives."""
    import time

    from tirl.core.logging import console
    from tirl.data import claim_rows_out, write_rows
    from tirl.sandbox import SandboxConfig, build_sandbox
    from tirl.tasks.gsm8k import gsm8k_id, gsm8k_records
    from tirl.tasks.gsm8k.stitch import StitchConfig, stitch_rows

    claim_rows_out(out, force=force)
    config = StitchConfig(max_steps=max_steps, wording=wording, style=style)
    if limit < 0:
        raise ValueError(f"--limit must be >= 0 (0: every row), got {limit}")
    records = gsm8k_records(split)[: limit or None]
    start = time.perf_counter()
    with build_sandbox(SandboxConfig()) as sandbox:
        rows, report = stitch_rows(
            records, [gsm8k_id(split, i) for i in range(len(records))], sandbox, config
        )
    path = write_rows(out, rows)
    console.print(
        f"gsm8k {split}: {report.kept} of {report.total} solutions kept -> {path} "
        f"({time.perf_counter() - start:.1f} s)"
    )
    for reason, n in sorted(report.dropped.items()):
        console.print(f"  dropped, {reason}: {n}")
    console.print("  steps of kept rows: " + ", ".join(f"{k}: {n}" for k, n in sorted(report.steps.items())))
    return 0 if rows else 1


def _schema_text(path: Path, rows: list[dict[str, Any]]) -> str:
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return str(pq.read_schema(path))
    types: dict[str, Counter] = {}
    for r in rows:
        for k, v in r.items():
            types.setdefault(k, Counter())[type(v).__name__] += 1
    return "\n".join(f"{k}: {', '.join(sorted(c))}" for k, c in types.items())


def build_inspect_renderer(model: str | None, fmt: str) -> Any:
    """A renderer over the model's own tokenizer, or over the Qwen vocabulary when no model is given; it lists the
    default tools (a row's own `tools` replace them)."""
    from tirl.chat.template import ChatRenderer
    from tirl.tools import default_tools

    tools = [t.schema for t in default_tools()]
    if model:
        from tirl.models.loading import load_tokenizer

        return ChatRenderer(load_tokenizer(model), fmt=fmt, tools=tools)
    from tirl.chat.qwen_vocab import qwen_tokenizer

    if fmt == "chatml":
        raise ValueError("the chatml format needs the tiny model's tokenizer: pass --model DIR")
    try:
        return ChatRenderer(qwen_tokenizer("qwen2.5" if fmt == "qwen2.5" else "qwen3"), fmt=fmt, tools=tools)
    except ImportError as e:
        raise ValueError(f"{e}; or pass --model DIR to count tokens with that model's tokenizer") from None


def inspect_command(
    file: str,
    *,
    model: str | None = None,
    fmt: str = "qwen3",
    example: int = 0,
    max_length: int = READ_MAX_TOKENS,
) -> int:
    """Schema, rows per data_source, one rendered example with its token count, invalid rows. 1 if any invalid, or
    if the example has more characters than `max_length` tokens can hold (it is then not tokenized)."""
    from tirl.core.logging import console

    def say(*args: Any, **kw: Any) -> None:
        console.print(*args, soft_wrap=True, **kw)

    report = ReadReport(file)
    rows = list(iter_rows(file, on_error="skip", report=report))
    say(f"[bold]{file}[/]: {report.rows} valid {report.kind} rows, {report.skipped} invalid")
    say("[bold]schema[/]", markup=True)
    say(_schema_text(Path(file), rows), markup=False)
    if report.kind == "rl":
        counts = Counter(r["data_source"] for r in rows)
        say("[bold]rows per data_source[/]")
        for source, n in sorted(counts.items()):
            say(f"  {source}: {n}", markup=False)
    shown = _show_example(rows, report.kind, model, fmt, example, max_length, say) if rows else True
    if report.errors:
        say(f"[bold red]{report.skipped} invalid rows[/]")
        for e in report.errors[:MAX_ERRORS_SHOWN]:
            say(f"  {e}", markup=False, highlight=False)
        if report.skipped > MAX_ERRORS_SHOWN:
            say(f"  ... and {report.skipped - MAX_ERRORS_SHOWN} more")
        return 1
    return 0 if shown else 1


def _show_example(
    rows: list[dict[str, Any]],
    kind: str,
    model: str | None,
    fmt: str,
    example: int,
    max_length: int,
    say: Any,
) -> bool:
    """Print row `example` rendered, with its token count; False (and a line saying why) when it has more
    characters than `max_length` tokens can hold, which it is then not rendered or tokenized for."""
    from tirl.data.lengths import check_row_chars

    index = min(example, len(rows) - 1)
    row = rows[index]
    try:
        check_row_chars(row, max_length, where=f"example row {index + 1}", key="--max-length")
    except ValueError as e:
        say(str(e), markup=False, highlight=False, style="bold red")
        return False
    renderer = build_inspect_renderer(model, fmt)
    if kind == "rl":
        text = renderer.text(row["prompt"], add_generation_prompt=True)
        ids = renderer.prompt_ids(row["prompt"])
    elif kind == "sft":
        text = "".join(p.text for p in renderer.pieces(row["messages"], tools=row.get("tools")))
        ids = renderer.render(row["messages"], tools=row.get("tools"))[0]
    else:
        text = row["prompt"] + row["completion"]
        ids = renderer.encode(text)
    say(f"[bold]example row {index + 1}[/] ({fmt}): {len(ids)} tokens")
    say(text, markup=False, highlight=False)
    return True


def _cmd_data(args: argparse.Namespace) -> int:
    if args.data_command == "prepare":
        return prepare_command(
            args.name, args.out, wording=args.wording, source=args.source, force=args.force, split=args.split,
            revision=args.revision,
        )  # fmt: skip
    if args.data_command == "stitch":
        return stitch_command(
            args.out,
            split=args.split,
            max_steps=args.max_steps,
            limit=args.limit,
            wording=args.wording,
            force=args.force,
            style=args.style,
        )
    return inspect_command(args.file, model=args.model, fmt=args.format, max_length=args.max_length)


def _add_stitch_parser(data: argparse._SubParsersAction) -> None:
    """`tirl data stitch gsm8k`."""
    from tirl.tasks.gsm8k import SPLITS
    from tirl.tasks.gsm8k.stitch import STYLES

    p = data.add_parser(
        "stitch", help="SFT tool trajectories from GSM8K's annotated solutions (real sandbox)"
    )
    p.add_argument("name", choices=["gsm8k"])
    p.add_argument(
        "--out", required=True, help="output file (.jsonl or .parquet); an existing one needs --force"
    )
    p.add_argument("--force", action="store_true", help="replace --out if it exists")
    p.add_argument("--split", choices=SPLITS, default="train", help="(default: train)")
    p.add_argument("--max-steps", type=int, default=0, help="keep solutions of at most N calculator steps")
    p.add_argument("--limit", type=int, default=0, help="only the split's first N solutions (default: all)")
    p.add_argument("--wording", choices=WORDINGS, default="recipe", help="user-turn wording, as data prepare")
    p.add_argument(
        "--style",
        choices=STYLES,
        default="code",
        help="code: one call with every step, the prose dropped (default); text: the solution's sentences kept, "
        "one call per step where its annotation stood; plain: the sentences alone, annotations removed, no tool "
        "(the no-tool arm, task gsm8k-no-tool)",
    )
    p.set_defaults(fn=_cmd_data)


def add_data_parser(sub: argparse._SubParsersAction) -> None:
    """The `data` subcommands, added to tirl's parser by cli.py."""
    from tirl.chat.template import FORMATS
    from tirl.data.hub import HUB_SETS

    data = sub.add_parser("data", help="prepare benchmark files; inspect a dataset").add_subparsers(
        dest="data_command", required=True
    )
    from tirl.commands.filter import add_filter_parser
    from tirl.commands.sample import add_sample_parser

    add_sample_parser(data)  # tirl data sample (commands/sample.py)
    add_filter_parser(data)  # tirl data filter (commands/filter.py)
    p = data.add_parser(
        "prepare",
        help="write a benchmark, or the recipe's SFT/RL/eval data fetched from the Hub, as rows (.parquet or .jsonl)",
    )
    tasks = prepared_tasks()
    p.add_argument("name", choices=[*tasks, *HUB_SETS])
    p.add_argument(
        "--out", required=True, help="output file (.parquet or .jsonl); an existing one needs --force"
    )
    p.add_argument("--force", action="store_true", help="replace --out if it exists")
    p.add_argument(
        "--wording", choices=WORDINGS, default="recipe", help="prompt wording (default: the recipe's)"
    )
    sources = "; ".join(f"{k}: {t.user_file}" for k, t in user_file_tasks(tasks).items())
    p.add_argument("--source", default=None, help=sources)
    p.add_argument(
        "--split",
        choices=("test", "train"),
        default="test",
        help="train: a task's own data only (default: test)",
    )
    p.add_argument(
        "--revision", default=None, help="open-agentrl-*: a branch, tag or commit (default: the pinned one)"
    )
    p.set_defaults(fn=_cmd_data)
    _add_stitch_parser(data)
    p = data.add_parser("inspect", help="schema, rows per data_source, a rendered example, invalid rows")
    p.add_argument("file")
    p.add_argument(
        "--model", default=None, help="tokenizer directory or Hub id (default: the Qwen vocabulary)"
    )
    p.add_argument("--format", choices=FORMATS, default="qwen3")
    p.add_argument(
        "--max-length",
        type=int,
        default=READ_MAX_TOKENS,
        help=f"tokens the example row may have: one with more characters than that can hold is not tokenized "
        f"(default {READ_MAX_TOKENS}; 0 = no limit)",
    )
    p.set_defaults(fn=_cmd_data)
