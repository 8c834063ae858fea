"""The benchmarks' own data: the packaged files (`files/`; provenance, hashes and licenses in files/SOURCE.md) and
the user's GPQA CSV as RL-schema rows, one function per benchmark: `(wording)` for a packaged one, `(wording, path)`
for one read from the user's copy of the published file.

Ground truths are normalized here, once: AIME's zero-padded "025" becomes "25", AMC's float 27.0 becomes "27".
HumanEval's tests are a JSON string (as in the LiveCodeBench file) so every row has the same parquet type.

Deliberately not here: what the recipe's Hub sets share with these rows (the prompt wording, the row shape, the
answer normalization and the LiveCodeBench conversion: `tirl.data.benchmarks`).
"""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path
from typing import Any

from tirl.data.benchmarks import (
    aime_answer,
    benchmark_row,
    choice_prompt,
    code_prompt,
    integer_answer,
    math_prompt,
    prepare_livecodebench,
    read_jsonl,
)

FILES = Path(__file__).parent / "files"


def _aime(source: str, files: list[str], wording: str) -> list[dict[str, Any]]:
    """AIME's or AMC's packaged rows (AMC's answers are not all 0 to 999: only AIME's are checked)."""
    answer = aime_answer if source.startswith("aime") else integer_answer
    rows = []
    for name in files:
        for i, r in enumerate(read_jsonl(FILES / name)):
            info = {"id": f"{source}-{r.get('id', i)}", "raw_answer": str(r["answer"])}
            try:
                truth = answer(r["answer"])
            except ValueError as e:
                raise ValueError(f"{FILES / name}: row {i + 1}: {e}") from None
            rows.append(benchmark_row(source, math_prompt(r["problem"], wording), "math", truth, info))
    return rows


def prepare_aime24(wording: str) -> list[dict[str, Any]]:
    return _aime("aime24", ["aime24/test.jsonl"], wording)


def prepare_aime25(wording: str) -> list[dict[str, Any]]:
    return _aime("aime25", ["aime25/test2025-I.jsonl", "aime25/test2025-II.jsonl"], wording)


def prepare_amc23(wording: str) -> list[dict[str, Any]]:
    return _aime("amc23", ["amc23/test.jsonl"], wording)


def prepare_math500(wording: str) -> list[dict[str, Any]]:
    return [
        benchmark_row(
            "math500",
            math_prompt(r["problem"], wording),
            "math",
            r["answer"],
            {"id": r["unique_id"], "subject": r["subject"], "level": r["level"], "solution": r["solution"]},
        )
        for r in read_jsonl(FILES / "math500/test.jsonl")
    ]


def prepare_humaneval(wording: str) -> list[dict[str, Any]]:
    rows = []
    for r in read_jsonl(FILES / "humaneval/HumanEval.jsonl.gz"):
        problem = f"Complete the following Python function.\n\n```python\n{r['prompt']}```"
        truth = {"prompt": r["prompt"], "test": r["test"], "entry_point": r["entry_point"]}
        info = {"id": r["task_id"], "canonical_solution": r["canonical_solution"]}
        rows.append(
            benchmark_row("humaneval", code_prompt(problem, wording), "code", json.dumps(truth), info)
        )
    return rows


GPQA_COLUMNS = (
    "Question",
    "Correct Answer",
    "Incorrect Answer 1",
    "Incorrect Answer 2",
    "Incorrect Answer 3",
)


def prepare_gpqa(wording: str, path: str | Path, *, seed: int = 0) -> list[dict[str, Any]]:
    """GPQA's published CSV (gpqa_diamond.csv); options shuffled per row with a seeded RNG, letters A-D."""
    p = Path(path)
    with open(p, encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in GPQA_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"{p}: not GPQA's CSV, missing column(s) {missing}")
        rows = []
        for n, r in enumerate(reader, 1):
            options = [(r[c] or "").strip() for c in GPQA_COLUMNS[1:]]  # a short row leaves None
            if not (r["Question"] or "").strip() or not all(options):
                raise ValueError(f"{p}: row {n}: empty question or option")
            order = list(range(4))
            random.Random(f"{seed}:{r.get('Record ID', n)}").shuffle(order)
            letters = "ABCD"
            body = "\n".join(f"{letters[k]}) {options[j]}" for k, j in enumerate(order))
            problem = f"{r['Question'].strip()}\n\n{body}"
            domain = (r.get("High-level domain") or "science").strip()
            info = {"id": r.get("Record ID") or f"gpqa-{n}", "domain": domain}
            rows.append(
                benchmark_row(
                    "gpqa_diamond",
                    choice_prompt(problem, domain, wording),
                    domain,
                    letters[order.index(0)],
                    info,
                )
            )
    return rows


__all__ = [
    "FILES",
    "GPQA_COLUMNS",
    "prepare_aime24",
    "prepare_aime25",
    "prepare_amc23",
    "prepare_gpqa",
    "prepare_humaneval",
    "prepare_livecodebench",
    "prepare_math500",
]
