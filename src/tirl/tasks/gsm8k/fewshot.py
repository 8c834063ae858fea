"""`gsm8k-fewshot`: GSM8K as SmolLM2's makers evaluate a model on it, few-shot chain of thought without a tool
(docs/gsm8k.md, "The base in its own format").

The makers' task (huggingface/smollm, `text/evaluation/tasks.py`: lighteval's `gsm8k` prompt, "GSM8K (5-shot)" on
the model cards) shows each shot as "Question: {question}\\nAnswer:" followed by its human solution as GSM8K writes
it, calculator annotations (`<<48/2=24>>`) and the closing "#### 72" line included, and reads a model's answer on
its first "#### N" line (lighteval's `quasi_exact_match_gsm8k`; tirl's gsm8k verifier reads that line when a
response has no box, `verifier.answer_line`). Here the shots are earlier user and assistant turns of the chat,
as lighteval renders few-shot examples with a chat template; no tool is listed or run, and no system prompt is set
(`chat.system_prompt`, when set, is used). A run sets `agent.max_turns: 1`: the one turn is the answer.

The rows are the gsm8k task's, from the same options and split seed: the same problems, ids, data source and
ground truths, only the prompt differs, so `tirl analyze` pairs this evaluation with the tool-using models' problem by
problem. The shots are the first `task.shots` train problems, in an order fixed by the split seed, among those
whose calculator steps are outside `task.levels`: problems no split of the task draws (SFT, RL, the validation
slice, the sample pool), and never a test problem.

Deliberately not here: lighteval's random draw of shots (one fixed set of shots serves every problem, so the
prompts differ only in the question), its stop at "Question" (the model's turn ends at its end-of-turn token; the
grader reads only the text before a "Question"), and a completion-style prompt without chat turns.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tirl.core.bounds import check_counts
from tirl.tasks.gsm8k.data import gsm8k_id, gsm8k_records
from tirl.tasks.gsm8k.task import GRADED, GSM8KOptions, calculator_steps, gsm8k_rows, split_seed
from tirl.tasks.task import Task, register_task

MAX_SHOTS = 64  # each shot is a few hundred tokens: more would not fit a small model's positions


@dataclass
class FewShotOptions(GSM8KOptions):
    """`task.*` of the gsm8k-fewshot task: the gsm8k task's splits, and the number of shots."""

    shots: int = 5  # the makers' "GSM8K (5-shot)"

    def __post_init__(self) -> None:
        super().__post_init__()
        check_counts(self, "task", {"shots": (1, MAX_SHOTS)})


def question(text: str) -> str:
    """A question as lighteval's gsm8k prompt asks it."""
    return f"Question: {text}\nAnswer:"


def shot_ids(options: FewShotOptions, seed: int) -> list[int]:
    """Indices of the shots in the train split: the first `task.shots` of the train problems outside
    `task.levels`, shuffled by the split seed."""
    levels = set(options.levels)
    if not levels:
        raise ValueError(
            "gsm8k-fewshot takes its shots from the train problems outside task.levels, which no split draws; "
            "task.levels = [] puts every train problem in a split: set task.levels (e.g. [1, 2])"
        )
    outside = [i for i, r in enumerate(gsm8k_records("train")) if calculator_steps(r) not in levels]
    random.Random(f"gsm8k-fewshot-{split_seed(options, seed)}").shuffle(outside)
    if options.shots > len(outside):
        raise ValueError(
            f"gsm8k-fewshot: task.shots = {options.shots} but only {len(outside)} train problems are outside "
            f"task.levels {sorted(levels)}"
        )
    return outside[: options.shots]


def shot_messages(shots: Sequence[dict[str, Any]]) -> list[dict[str, str]]:
    """Each shot (a GSM8K record) as a user turn asking its question and an assistant turn with its solution."""
    out = []
    for s in shots:
        out += [
            {"role": "user", "content": question(s["question"])},
            {"role": "assistant", "content": s["answer"]},
        ]
    return out


def as_fewshot(rows: Sequence[dict[str, Any]], options: FewShotOptions, seed: int) -> list[dict[str, Any]]:
    """gsm8k rows (test or train ids, e.g. the study's validation slice) with the few-shot prompt: the shots, then
    the row's question; everything else as it was. A row that is one of the shots is an error naming it."""
    train = gsm8k_records("train")
    ids = shot_ids(options, seed)
    shots = shot_messages([train[i] for i in ids])
    taken = {gsm8k_id("train", i) for i in ids}
    records = {
        gsm8k_id(split, i): r for split in ("train", "test") for i, r in enumerate(gsm8k_records(split))
    }
    out = []
    for row in rows:
        pid = str(row.get("extra_info", {}).get("id"))
        if pid in taken:
            raise ValueError(f"gsm8k-fewshot: problem {pid} is one of the shots (task.levels, split seed)")
        if pid not in records:
            raise ValueError(
                f"gsm8k-fewshot: row id {pid!r} is not a GSM8K problem (gsm8k-N or gsm8k-train-N)"
            )
        out.append(
            {**row, "prompt": [*shots, {"role": "user", "content": question(records[pid]["question"])}]}
        )
    return out


def fewshot_rows(split: str, options: FewShotOptions, seed: int) -> list[dict[str, Any]]:
    """The gsm8k task's rows of `split` (RL problems for "train", the held-out ones for "test"), prompted with
    the shots."""
    return as_fewshot(gsm8k_rows(split, options, seed), options, seed)


register_task(Task("gsm8k-fewshot", **GRADED, tools=(), rows=fewshot_rows, options=FewShotOptions))
