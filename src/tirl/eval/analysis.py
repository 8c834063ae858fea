"""The comparison behind `tirl analyze`: every number of the report, from loaded runs, as one JSON-ready dict.

Per data source, each model's accuracy at each temperature (`tirl.eval.accuracy`: avg@n, pass@k, maj@k, Cover@tau,
the histogram, the envelope over temperatures) and each model against the first (the baseline) on the problems
both have (`tirl.eval.comparison`: the paired difference, the crossover k, the solvable sets), with the one-line
findings. Per model, from its responses: tool-use statistics split by correct / incorrect, the lucky-guess audit of
correct answers (`audit_block`), and the reasoning mode: accuracy by tool calls per answer and whether correct
answers make fewer calls than wrong ones on the same problem (`tirl.eval.reasoning_mode`).

A counts-only run (tirl.eval.counts) has grades but no responses: what needs them is skipped for it, never computed
from placeholder grades (`tirl.eval.tables`), and its run carries a note.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from dataclasses import asdict

from tirl.eval import audit
from tirl.eval.accuracy import Curves, model_entry
from tirl.eval.comparison import compare, conditions, crossover_sentence
from tirl.eval.reasoning_mode import reasoning_mode
from tirl.eval.samples import Run, Sample
from tirl.eval.tables import AnalysisConfig, Table, build_tables
from tirl.rollout.agent.toolstats import tool_stats


def audit_block(samples: Sequence[Sample], cfg: AnalysisConfig) -> dict:
    """Among correct answers with text: share with >= 1 false arithmetic statement, examples, answer source."""
    correct = [s for s in samples if s.record.correct and (s.reasoning or s.raw_output)]
    with_false, checked, statements = 0, 0, 0
    examples = []
    sources = {"tool": 0, "text": 0, "n/a": 0}
    for s in correct:
        found = audit.find_statements(s.reasoning)
        statements += len(found)
        checked += bool(found)
        false = [st for st in found if not st.true]
        if false:
            with_false += 1
            if len(examples) < cfg.max_examples:
                st = false[0]
                examples.append(
                    {
                        "problem_id": s.record.problem_id,
                        "sample_index": s.record.sample_index,
                        "statement": st.text,
                        "values": [str(v) for v in st.values],
                        "answer": s.record.pred,
                    }
                )
        sources[audit.answer_source(s.record.pred, s.tool_outputs)] += 1
    m = max(1, len(correct))
    return {
        "correct_answers": len(correct),
        "with_statements": checked,
        "statements": statements,
        "with_false_statement": with_false,
        "false_share": with_false / m,
        "examples": examples,
        "answer_source": {k: v / m for k, v in sources.items()},
    }


def tool_block(samples: Sequence[Sample]) -> dict[str, float]:
    return tool_stats([s.record for s in samples], [s.record.correct for s in samples])


def _source_entry(
    source: str,
    tables: dict[str, dict[str, dict[str, Table]]],
    labels: list[str],
    pairs: list[tuple[str, str]],
    cfg: AnalysisConfig,
) -> dict:
    entry: dict = {"models": {}, "comparisons": []}
    curves: dict[str, dict[str, Curves]] = {}
    for label in labels:
        if tables[label].get(source):
            entry["models"][label], curves[label] = model_entry(tables[label][source], cfg, source)
    for base, other in pairs:
        if base not in curves or other not in curves:
            continue
        temps_a = [t for t in curves[base] if t != "envelope"]
        temps_b = [t for t in curves[other] if t != "envelope"]
        for name, ta, tb in conditions(temps_a, temps_b):
            entry["comparisons"].append(compare(base, other, curves[base][ta], curves[other][tb], name, cfg))
    return entry


def _meta(runs: Sequence[Run], cfg: AnalysisConfig) -> dict:
    """When the report was made, with which settings, from which runs (the first is the baseline)."""
    run_meta = [
        {
            "label": r.label,
            "path": r.path,
            "kind": r.kind,
            "samples": r.num_samples,
            "tokenizer": r.tokenizer_path,
            "notes": r.notes,
        }
        for r in runs
    ]
    return {
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "config": asdict(cfg),
        "runs": run_meta,
        "baseline": runs[0].label,
    }


def _response_analyses(sampled: Sequence[Run], cfg: AnalysisConfig) -> dict:
    """Per model with samples: tool use per source, the reasoning mode, and the audit (where it has any text)."""
    tool_use = {
        r.label: {
            src: tool_block([s for s in r.samples if s.record.data_source == src])
            for src in sorted({s.record.data_source for s in r.samples})
        }
        for r in sampled
    }
    modes = {  # tool calls per answer against accuracy (`tirl.eval.reasoning_mode`)
        r.label: reasoning_mode(
            [s.record for s in r.samples], num_resamples=cfg.num_resamples, seed=cfg.seed, level=cfg.level
        )
        for r in sampled
    }
    audits = {
        r.label: audit_block(r.samples, cfg)
        for r in sampled
        if any(s.reasoning or s.raw_output for s in r.samples)
    }
    return {"tool_use": tool_use, "reasoning_mode": modes, "audit": audits}


def analyze_runs(
    runs: Sequence[Run], cfg: AnalysisConfig, pairs: list[tuple[str, str]] | None = None
) -> dict:
    """The whole report; runs[0] is the baseline every other run is compared with, unless `pairs` names the
    (base, other) labels to compare (over seeds: each seed's models with the same seed's baseline)."""
    labels = [r.label for r in runs]
    pairs = [(labels[0], other) for other in labels[1:]] if pairs is None else pairs
    if len(set(labels)) != len(labels):
        raise ValueError(
            f"model labels must be distinct, got {labels} (use --labels; --seeds pools runs of a label)"
        )
    tables = {r.label: build_tables(r) for r in runs}
    sources = sorted({s for t in tables.values() for s in t})
    report: dict = {
        "meta": _meta(runs, cfg),
        "models": labels,
        "sources": {src: _source_entry(src, tables, labels, pairs, cfg) for src in sources},
    }
    report["findings"] = [
        f"[{src}] {crossover_sentence(c)}" for src, e in report["sources"].items() for c in e["comparisons"]
    ]
    sampled = [r for r in runs if r.counts is None]  # a counts-only run has no samples (its note says so)
    report.update(_response_analyses(sampled, cfg))
    return report
