"""A copy warm-up for tiny models trained from scratch: the skill every later stage assumes, and nothing more.

A real base model arrives able to copy text; a freshly initialised 1M-parameter model does not, and learning to copy
numbers (question -> code, tool output -> answer) inside multi-turn chat SFT takes it thousands of steps. The demo
first trains it briefly on prompt/completion pairs that are pure copies: a question followed by its expression, and
a tool result followed by the same number in `\\boxed{}`. No tool use, chat format or answer is taught here:
those come from SFT. The pairs come from problems of the SFT split only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tirl.tasks.arith.problems import Problem


def copy_warmup_rows(problems: Sequence[Problem]) -> list[dict[str, Any]]:
    """Prompt/completion rows (the loss is on the completion only)."""
    rows: list[dict[str, Any]] = []
    for p in problems:
        rows.append({"prompt": f"{p.question}\n", "completion": f"{p.expression}\n"})
        rows.append(
            {
                "prompt": f"<tool_response>\n{p.answer}\n</tool_response>\n\\boxed{{",
                "completion": f"{p.answer}}}",
            }
        )
    return rows
