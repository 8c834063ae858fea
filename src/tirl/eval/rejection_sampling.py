"""Real end-to-end tool trajectories by rejection sampling, as SFT rows (`tirl data sample`, whose front end is
`tirl.commands.sample`).

A model, through the run's engine (`rollout.*`) and the real sandbox, samples n trajectories per problem exactly
as `tirl eval` does (the same agent, the same `rollout_and_score`). Kept: samples the verifier grades correct (its
verdict, never a shaped reward), with at least one executed tool call (unless `require_tool` is off), not a
duplicate of a kept sample's assistant text, at most `keep` per problem in sample order. Each kept sample becomes
an SFT row (`messages` with its tool calls and tool outputs as sampled, `tools`) that must re-render to the
sampled ids, its loss mask on exactly the assistant tokens: a row that does not is dropped and counted, since SFT
would train on other tokens than the model sampled. With `keep_retokenized`, a row whose rendering is the very
text sampled, only split into other tokens (a non-canonical split), is kept as text instead: SFT renders and
tokenizes its rows anyway, and the RL token stream is untouched. Rejection-sampling fine-tuning and expert
iteration loop this command with `tirl sft`; `tirl data filter` (eval/pass_rate_filter.py) samples the same way
to keep the problems a model solves sometimes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from tirl.chat.template import ChatRenderer
from tirl.chat.tokcheck import Divergence, first_divergence
from tirl.core.bounds import MAX_COUNT, check_range
from tirl.data.records import ProblemRow, problem_rows
from tirl.rollout.types import Trajectory

SHOWN_FAILURES = 5


@dataclass
class SampleConfig:
    n: int = 8  # samples per problem
    keep: int = 1  # kept per problem at most (the first correct, distinct ones in sample order)
    require_tool: bool = True  # keep only samples with at least one executed tool call
    # keep a correct sample whose SFT rendering is its sampled text split into other tokens (module docstring)
    keep_retokenized: bool = False

    def __post_init__(self) -> None:
        if self.n < 1 or self.keep < 1:
            raise ValueError(f"--n and --keep must be >= 1, got {self.n}, {self.keep}")
        check_range("--n", self.n, 1, MAX_COUNT)  # each problem's samples are held at once
        check_range("--keep", self.keep, 1, MAX_COUNT)


@dataclass
class SampleStats:
    """What happened to the samples; written as the summary JSON next to the rows."""

    problems: int = 0
    samples: int = 0
    correct: int = 0
    kept: int = 0
    no_tool: int = 0  # correct, but no executed tool call (require_tool)
    duplicates: int = 0  # correct, but the same assistant text as a sample already kept
    token_check_failed: int = 0  # the SFT row does not re-render to the sampled ids and mask
    retokenized: int = 0  # kept although not the sampled ids: the same text, re-tokenized (keep_retokenized)
    over_keep: int = 0  # correct and distinct, past the `keep` cap
    kept_per_problem: dict[str, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)  # the first token-check divergences, described

    def summary(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["problems_with_kept"] = sum(1 for k in self.kept_per_problem.values() if k)
        return out


def assistant_message(text: str, renderer: ChatRenderer) -> dict[str, Any]:
    """A sampled turn as an assistant message: its tool calls in the OpenAI form when they render back to the
    very text sampled (in the renderer's tool format), else the text as it was (a malformed call, an odd layout)
    so it renders unchanged (a parser that raises included: the turn is kept as text)."""
    text = text.removesuffix(renderer.eos_text)
    fmt = renderer.tool_format
    if fmt.start in text:
        head = text[: text.index(fmt.start)]
        try:
            calls = renderer.parse_calls(text)
        except Exception:  # noqa: BLE001 - a format's bug must not end `tirl data sample`
            calls = []
        if calls and all(c.error is None and c.name for c in calls):
            msg = {
                "role": "assistant",
                "content": head.removesuffix(fmt.separator),
                "tool_calls": [
                    {"type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                    for c in calls
                ],
            }
            if renderer.assistant_body(msg) == text:
                return msg
    return {"role": "assistant", "content": text}


def trajectory_messages(t: Trajectory, renderer: ChatRenderer) -> list[dict[str, Any]]:
    """The conversation a trajectory sampled: its prompt (with the system turn it was prompted with), each turn
    and the tool results the model saw after it (a last turn's results were never appended)."""
    if t.problem is None:
        raise ValueError("a trajectory without its problem has no prompt to write")
    responses: dict[int, list[str]] = {}
    for c in t.tool_calls:  # `turn` counts from 1: the calls of turn k (0-based) carry k + 1
        responses.setdefault(c.turn, []).append(c.response)
    msgs = renderer.with_system(t.problem.prompt)
    for k, text in enumerate(t.turn_texts):
        msgs.append(assistant_message(text, renderer))
        if k + 1 < len(t.turn_texts):
            msgs += [{"role": "tool", "content": r} for r in responses.get(k + 1, [])]
    return msgs


def sampled_stream(renderer: ChatRenderer, t: Trajectory) -> tuple[list[int], list[int]]:
    """(ids, mask) an SFT row of `t` must render to: the sampled ids plus the template's newline after the last
    `<|im_end|>`; mask 1 on every sampled token and on the `<|im_end|>` the agent loop closed a tool-calling turn
    with (not sampled, but the assistant's own token in the template), 0 elsewhere."""
    nl = renderer.encode("\n")
    ids = t.prompt_ids + t.response_ids + nl
    mask = [0] * len(t.prompt_ids) + list(t.loss_mask) + [0] * len(nl)
    for i in range(len(t.prompt_ids) + 1, len(ids)):
        if ids[i] == renderer.eos_id and mask[i] == 0 and mask[i - 1] == 1:
            mask[i] = 1
    return ids, mask


def _decode(renderer: ChatRenderer, ids: Sequence[int]) -> str:
    return renderer.tokenizer.decode(list(ids), skip_special_tokens=False)


def sft_row_divergence(
    renderer: ChatRenderer, row: dict[str, Any], t: Trajectory, num: int
) -> Divergence | None:
    """Where the SFT row's rendering departs from the sampled trajectory (`sampled_stream`), or None."""
    ids, mask = sampled_stream(renderer, t)
    got_ids, got_mask = renderer.render(row["messages"], tools=row["tools"])
    return first_divergence(num, got_ids, got_mask, ids, mask, lambda x: _decode(renderer, x))


def same_text(renderer: ChatRenderer, row: dict[str, Any], t: Trajectory) -> bool:
    """Whether the SFT row renders to the very text sampled, with the loss on the same text: what a row whose ids
    differ only by the tokenizer's own split (a non-canonical sample) has, and a verl token stream has not."""
    ids, mask = sampled_stream(renderer, t)
    got_ids, got_mask = renderer.render(row["messages"], tools=row["tools"])
    if _decode(renderer, got_ids) != _decode(renderer, ids):
        return False
    trained = lambda x, m: _decode(renderer, [i for i, b in zip(x, m, strict=True) if b])  # noqa: E731
    return trained(got_ids, got_mask) == trained(ids, mask)


def select(
    trajs: Sequence[Trajectory], cfg: SampleConfig, renderer: ChatRenderer, stats: SampleStats
) -> list[dict[str, Any]]:
    """The SFT rows kept from one problem's samples (in sample order), with `stats` updated."""
    rows: list[dict[str, Any]] = []
    seen: set[tuple[str, ...]] = set()
    pid = trajs[0].problem.problem_id if trajs[0].problem else ""
    for t in trajs:
        stats.samples += 1
        if t.outcome is None or not t.outcome.correct:
            continue
        stats.correct += 1
        if cfg.require_tool and t.num_executed_calls == 0:
            stats.no_tool += 1
            continue
        key = tuple(t.turn_texts)  # same ids decode to the same text: one key catches both
        if key in seen:
            stats.duplicates += 1
            continue
        seen.add(key)
        if len(rows) >= cfg.keep:
            stats.over_keep += 1
            continue
        row = _row(t, renderer)
        if d := sft_row_divergence(renderer, row, t, stats.kept + stats.token_check_failed + 1):
            if cfg.keep_retokenized and same_text(renderer, row, t):
                stats.retokenized += 1
                rows.append({**row, "retokenized": True})  # the one mark of a row kept as text
                continue
            stats.token_check_failed += 1
            if len(stats.failures) < SHOWN_FAILURES:
                stats.failures.append(f"problem {pid} sample {t.sample}: {d.describe()}")
            continue
        rows.append(row)
    stats.problems += 1
    stats.kept += len(rows)
    stats.kept_per_problem[pid] = len(rows)
    return rows


def _row(t: Trajectory, renderer: ChatRenderer) -> dict[str, Any]:
    assert t.problem is not None and t.outcome is not None  # rollout_and_score sets both
    return {
        "messages": trajectory_messages(t, renderer),
        "tools": renderer.tools,
        "problem_id": t.problem.problem_id,
        "data_source": t.problem.data_source,
        "sample": t.sample,
        "pred": t.outcome.pred,
    }


def sample_rows(
    agent: Any,
    rows: Sequence[dict[str, Any] | ProblemRow],
    cfg: SampleConfig,
    *,
    params: Any,
    reward: Any,
    seed: int,
    batch_problems: int = 32,
) -> tuple[list[dict[str, Any]], SampleStats]:
    """n samples per problem through `agent`, `batch_problems` problems at a time; (kept rows, stats)."""
    stats, out = SampleStats(), []
    groups = sampled_groups(
        agent, rows, cfg.n, params=params, reward=reward, seed=seed, batch_problems=batch_problems,
        what="sample", info=lambda: f"kept {stats.kept}",
    )  # fmt: skip
    for _, trajs in groups:
        out += select(trajs, cfg, agent.renderer, stats)
    return out, stats


def sampled_groups(
    agent: Any,
    rows: Sequence[dict[str, Any] | ProblemRow],
    n: int,
    *,
    params: Any,
    reward: Any,
    seed: int,
    batch_problems: int,
    what: str,
    info: Callable[[], str] = str,
) -> Iterator[tuple[ProblemRow, list[Trajectory]]]:
    """Each problem with its `n` scored samples, in problem order, rolled out `batch_problems` problems at a time
    from one generator seeded by `seed` (the same seed, the same samples); a progress bar shows `info()`, and a dead
    sandbox is an error naming `what` (the command) and the problems."""
    from tirl.core.progress import progress
    from tirl.rollout.agent.episodes import check_prompt_lengths, model_positions, rollout_and_score

    problems = problem_rows(rows)
    check_prompt_lengths(problems, agent, model_positions(agent), what="sample")
    gen = torch.Generator().manual_seed(seed)
    with progress(f"{what} n={n}", len(problems)) as bar:
        for s in range(0, len(problems), batch_problems):
            chunk = problems[s : s + batch_problems]
            where = f"{what}, problems {s + 1}-{s + len(chunk)}"
            trajs, _ = rollout_and_score(agent, chunk, params, n=n, reward=reward, generator=gen, where=where)
            for g, problem in enumerate(chunk):
                yield problem, trajs[g * n : (g + 1) * n]
            bar.advance(len(chunk), info=info())


def summary_path(out: str | Path) -> Path:
    """Where the summary JSON of rows written to `out` goes: `rows.jsonl` -> `rows.jsonl.summary.json` (the suffix
    kept, so `rows.jsonl` and `rows.parquet` never share one)."""
    out = Path(out)
    return out.with_name(out.name + ".summary.json")


def engine_dir(out: str | Path) -> Path:
    """The engine's working directory for rows written to `out`: `rows.jsonl` -> `rows.jsonl.engine/` (a vLLM
    server's log, and the merged copy it serves of a model it cannot load as is), never `out`'s directory itself."""
    out = Path(out)
    return out.with_name(out.name + ".engine")
