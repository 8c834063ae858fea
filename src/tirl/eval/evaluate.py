"""Evaluation: n samples per problem through the agent loop, one record per sample, summaries per data source.

Records are flat dicts (see `SampleRecord`), written as JSONL next to the full trajectories so that later analysis
(pass@k curves, solvable sets, tool-use statistics) never needs to re-run the model; the per-problem correct counts
beside them (`counts.jsonl`) are small enough to commit, and pass@k with its intervals recomputes from them alone.

Every prompt must leave room for the response within the model's positions (`max_position_embeddings`): a row
whose prompt plus `agent.max_response_tokens` would run past them is an error naming the row, raised before any
sampling. It is not skipped: an evaluation over a silently smaller set would not be the one asked for.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from tirl.core.io import atomic_write_json, atomic_write_jsonl
from tirl.core.progress import progress
from tirl.data.records import ProblemRow, problem_rows
from tirl.eval.answers import canonical_answers
from tirl.eval.config import EvalConfig
from tirl.eval.counts import COUNTS_FILE, counts_from_records, write_counts
from tirl.eval.metrics import default_ks, summarize
from tirl.eval.verl_metrics import bootstrap_summary
from tirl.rewards.shaping import RewardConfig
from tirl.rollout.agent.episodes import check_prompt_lengths, model_positions, rollout_and_score
from tirl.rollout.agent.loop import AgentLoop
from tirl.rollout.agent.toolstats import tool_stats
from tirl.rollout.sampling import SamplingParams
from tirl.rollout.types import Trajectory


@dataclass
class SampleRecord:
    """One evaluated sample; the unit every metric is computed from. Schema: docs/eval-records.md.

    `records.jsonl` holds one of these per line, in the same order as `trajectories.jsonl`. Fields that an
    imported run (a verl dump) cannot know are None there: temperature, top_p, response_tokens.
    """

    model: str
    problem_id: str
    data_source: str
    sample_index: int
    temperature: float | None
    top_p: float | None
    correct: bool
    score: float
    pred: str | None
    num_tool_calls: int
    num_tool_errors: int
    turns: int
    response_tokens: int | None
    stop_reason: str


def evaluate(
    agent: AgentLoop,
    rows: Sequence[dict[str, Any] | ProblemRow],
    cfg: EvalConfig,
    *,
    model_label: str,
    seed: int,
    reward: RewardConfig | None = None,
) -> tuple[list[SampleRecord], list[Trajectory]]:
    """Roll out every row n times per temperature and grade each sample (reward shaping off unless given).

    Records and trajectories come temperature by temperature, problem by problem, sample by sample.
    """
    rows = problem_rows(rows)[: cfg.max_problems or None]
    check_prompt_lengths(rows, agent, model_positions(agent))
    reward = (
        reward or RewardConfig()
    )  # its grading and code-test timeout; shaping stays off unless configured
    gen = torch.Generator().manual_seed(seed)
    records: list[SampleRecord] = []
    trajs: list[Trajectory] = []
    for temperature in cfg.all_temperatures:
        params = SamplingParams(temperature=temperature, top_p=cfg.top_p)
        label = model_label if len(cfg.all_temperatures) == 1 else f"{model_label} T={temperature:g}"
        recs, out = _evaluate_at(agent, rows, cfg, params, reward, gen, label=label, model_label=model_label)
        records += recs
        trajs += out
    return records, trajs


def _evaluate_at(
    agent: AgentLoop,
    rows: list[ProblemRow],
    cfg: EvalConfig,
    params: SamplingParams,
    reward: RewardConfig,
    gen: torch.Generator,
    *,
    label: str,
    model_label: str,
) -> tuple[list[SampleRecord], list[Trajectory]]:
    records: list[SampleRecord] = []
    trajs: list[Trajectory] = []
    with progress(f"eval {label}", len(rows)) as bar:
        for s in range(0, len(rows), cfg.batch_problems):
            chunk = rows[s : s + cfg.batch_problems]
            where = f"eval {label}, problems {s + 1}-{s + len(chunk)}"
            out, scores = rollout_and_score(
                agent, chunk, params, n=cfg.n, reward=reward, generator=gen, where=where
            )
            for t, sc in zip(out, scores, strict=True):
                # rollout_and_score gives every trajectory its origin
                assert t.problem is not None and t.sample is not None
                records.append(
                    SampleRecord(
                        model_label,
                        t.problem.problem_id,
                        t.problem.data_source,
                        t.sample,
                        params.temperature,
                        cfg.top_p,
                        sc.correct,
                        sc.reward,
                        sc.pred,
                        t.num_tool_calls,
                        t.num_tool_errors,
                        t.turns,
                        t.response_length,
                        t.stop_reason,
                    )
                )
            trajs += out
            bar.advance(len(chunk))
    return records, trajs


def summarize_records(records: Sequence[SampleRecord], ks: Sequence[int] = ()) -> dict[str, dict[str, float]]:
    """Per data source and overall: avg@n, pass@k, maj@k (answers grouped by the verifier's equivalence, as in
    `tirl analyze`, so both report the same maj@k), tool use (rollout/agent/toolstats.py's names).

    With several temperatures, each source is summarised per temperature under "<source> T=<t>" (samples of
    different temperatures are never pooled into one pass@k).
    """
    by_temp: dict[float | None, list[SampleRecord]] = defaultdict(list)
    for r in records:
        by_temp[r.temperature].append(r)
    out: dict[str, dict[str, float]] = {}
    for t, recs in by_temp.items():
        suffix = "" if len(by_temp) == 1 else f" T={t:g}"
        by_source: dict[str, list[SampleRecord]] = defaultdict(list)
        for r in recs:
            by_source[r.data_source].append(r)
        out.update({src + suffix: _summary(rs, ks) for src, rs in sorted(by_source.items())})
        if len(by_source) > 1:
            out["all" + suffix] = _summary(recs, ks)
    return out


def _summary(records: Sequence[SampleRecord], ks: Sequence[int]) -> dict[str, float]:
    # keyed by source and id: two data sources may both number their problems 0..N
    by_problem: dict[tuple[str, str], tuple[list[bool], list[str | None]]] = defaultdict(lambda: ([], []))
    for r in records:
        by_problem[(r.data_source, r.problem_id)][0].append(r.correct)
        by_problem[(r.data_source, r.problem_id)][1].append(r.pred)
    problems = {  # answers grouped by the equivalence of each source's verifier
        f"{src}/{pid}": (correct, canonical_answers(preds, src))
        for (src, pid), (correct, preds) in by_problem.items()
    }
    n = len(next(iter(problems.values()))[0])
    out = summarize(problems, list(ks) or default_ks(n))
    # verl's bootstrap estimators vote on the raw answer strings, not on the equivalence classes above
    boot = [
        bootstrap_summary(correct, preds, list(ks) or default_ks(n)) for correct, preds in by_problem.values()
    ]
    out.update({key: float(sum(b[key] for b in boot) / len(boot)) for key in boot[0]})
    tools = tool_stats(records, [r.correct for r in records])  # the names of the RL logs and `tirl analyze`
    out.update({k: v for k, v in tools.items() if "/" not in k and k != "responses"})
    return out


def render_generations(trajs: Sequence[Trajectory], tokenizer: Any, k: int) -> str:
    """The first `k` evaluated samples as text (input, output, score), as verl logs its validation generations."""
    parts = []
    for t in trajs[:k]:
        source, pid = (t.problem.data_source, t.problem.problem_id) if t.problem else (None, None)
        score, correct = (t.outcome.score, t.outcome.correct) if t.outcome else (None, None)
        head = f"# {source} {pid} sample {t.sample} score={score} correct={correct} stop={t.stop_reason}"
        parts.append(head + "\n" + tokenizer.decode(t.prompt_ids + t.response_ids, skip_special_tokens=False))
    return "\n\n".join(parts)


def write_eval(
    out_dir: str | Path, records: Sequence[SampleRecord], trajs: Sequence[Trajectory], summary: dict[str, Any]
) -> Path:
    """records.jsonl, trajectories.jsonl, counts.jsonl (per-problem correct counts, `tirl.eval.counts`) and
    summary.json: all four or none. Each is written under a staging name first and renamed into place once all are
    written, the summary last, so a full disk never leaves records without their summary (nor beside an earlier
    evaluation's, which is removed first)."""
    out = Path(out_dir)
    staged: list[tuple[Path, Path]] = []
    try:
        for name, write, data in (
            ("records.jsonl", atomic_write_jsonl, [asdict(r) for r in records]),
            ("trajectories.jsonl", atomic_write_jsonl, [t.to_dict() for t in trajs]),
            (COUNTS_FILE, write_counts, counts_from_records(records)),
            ("summary.json", atomic_write_json, summary),
        ):
            staged.append((write(out / f".{name}.staged", data), out / name))
        (out / "summary.json").unlink(missing_ok=True)
        for path, final in staged:
            os.replace(path, final)
    except BaseException:
        for path, _ in staged:
            path.unlink(missing_ok=True)
        raise
    return out
