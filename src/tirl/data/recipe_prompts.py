"""The recipe's rewrite of RL training prompts (`rl.prompt_rewrite=verl`), ported from the behaviour of
Open-AgentRL's `CustomRLHFDataset` (recipe/demystify/reward.py).

The recipe rewrites every prompt of a file as it loads it, and picks the branch once per file from the file's
*first* row's `data_source`:
  - `math_dapo` or `mega-science`: the prompt gets a units note appended;
  - anything else (the "skywork" branch), row by row: a `data_source` containing "code" (case-sensitive) gets the
    agent note and the code-submission note appended; any other row is wrapped in the math prompt, the agent note,
    the answer format, and a second wording of the units note.
The recipe's other branches rebuild its evaluation files (AIME 2024/2025, gpqa_diamond, LiveCodeBench_v6) from
their raw columns; `tirl data prepare --wording recipe` already writes those prompts, so files whose first
source is one of them are used as stored.

Not here: the prompts of evaluation benchmarks (tirl.data.benchmarks).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from tirl.data.benchmarks import AGENT_PROMPT, ANSWER_FORMAT, CODE_NOTE, MATH_PROMPT_1, MATH_PROMPT_2

UNITS_NOTE = (
    "\nDo not put units of the final answer inside \\boxed{}. The content of \\boxed{} should be the numerical "
    "value of the final answer only, without any units."
)
UNITS_NOTE_SKYWORK = (
    "\nDo not put units of the final answer inside \\boxed{}. The content of \\boxed{} should be the final "
    "numerical value of the final answer only, without any units."
)  # the recipe words its two units notes differently; both are kept as written
UNITS_SOURCES = ("math_dapo", "mega-science")
PREPARED_SOURCES = ("AIME2024", "AIME2025", "gpqa_diamond", "LiveCodeBench_v6")


def _rewrite_units(content: str, data_source: str) -> str:
    return content + UNITS_NOTE


def _rewrite_skywork(content: str, data_source: str) -> str:
    if "code" in data_source:
        return content + AGENT_PROMPT + CODE_NOTE
    return MATH_PROMPT_1 + content + MATH_PROMPT_2 + AGENT_PROMPT + ANSWER_FORMAT + UNITS_NOTE_SKYWORK


def rewrite_prompts(rows: Sequence[dict[str, Any]], *, where: str = "rl.data") -> list[dict[str, Any]]:
    """Copies of one file's `rows` with the recipe's rewrite applied to each first user message (see module doc)."""
    if not rows:
        return []
    first = str(rows[0].get("data_source", ""))
    if first in PREPARED_SOURCES:
        return list(rows)
    rewrite = _rewrite_units if first in UNITS_SOURCES else _rewrite_skywork
    out = []
    for i, row in enumerate(rows):
        prompt = row.get("prompt")
        if not prompt or not isinstance(prompt[0], dict) or not isinstance(prompt[0].get("content"), str):
            raise ValueError(
                f"{where} row {i}: rl.prompt_rewrite=verl rewrites the first message's text, but the row's prompt "
                f"is {prompt!r}; store prompts as [{{'role': 'user', 'content': ...}}]"
            )
        new = copy.deepcopy(row)
        new["prompt"][0]["content"] = rewrite(prompt[0]["content"], str(row.get("data_source", "")))
        out.append(new)
    return out


__all__ = ["UNITS_NOTE", "UNITS_NOTE_SKYWORK", "rewrite_prompts"]
