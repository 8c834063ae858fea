"""A scripted solver that writes SFT trajectories for the arithmetic task, with tool outputs from the real sandbox.

Most trajectories are clean (one call, the answer copied from its output). A configurable share is imperfect, so
that the SFT model inherits habits RL can remove:
- `no_tool`: answers "in its head" without calling the tool (and a tiny model's head is wrong);
- `fix`: the first call fails (a typo), the error comes back, a corrected call follows;
- `copy_error`: the call is right but the answer copies its output with one digit wrong.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tirl.core.bounds import MAX_CHARS, check_counts
from tirl.sandbox.types import Sandbox
from tirl.tasks.arith.problems import Problem
from tirl.tasks.toolcalls import code_call, run_with_progress
from tirl.tools.base import truncate_middle
from tirl.tools.code_interpreter import CODE_INTERPRETER_SCHEMA, format_tool_output

TRAJECTORY_STYLES = ("clean", "no_tool", "fix", "copy_error")


@dataclass
class SolverConfig:
    share_no_tool: float = 0.2
    share_fix: float = 0.1
    share_copy_error: float = 0.15
    max_tool_response_chars: int = 256

    def __post_init__(self) -> None:
        shares = (self.share_no_tool, self.share_fix, self.share_copy_error)
        if any(s < 0 for s in shares) or sum(shares) > 1:
            raise ValueError(f"solver shares must be >= 0 and sum to at most 1, got {shares}")
        check_counts(self, "task.solver", {"max_tool_response_chars": (0, MAX_CHARS)})


def _corrupt_digit(rng: random.Random, number: str) -> str:
    """`number` with one digit replaced by a different one (never a new leading zero)."""
    digits = [i for i, ch in enumerate(number) if ch.isdigit()]
    if not digits:
        return number + "0"
    i = rng.choice(digits)
    first = i == digits[0] and len(digits) > 1
    choices = [d for d in "0123456789" if d != number[i] and not (first and d == "0")]
    return number[:i] + rng.choice(choices) + number[i + 1 :]


def _guess(rng: random.Random, answer: int) -> str:
    """An in-head estimate: the leading digits right, the rest made up."""
    s = str(answer)
    keep = max(1, len(s) // 2)
    return s[:keep] + "".join(rng.choice("0123456789") for _ in s[keep:])


def _typo(rng: random.Random, expression: str) -> str:
    if rng.random() < 0.5:
        return f"result = {expression}\nprint(reslt)"  # NameError
    return f"print({expression}"  # SyntaxError


def choose_styles(n: int, config: SolverConfig, *, seed: int) -> list[str]:
    rng = random.Random(seed)
    cuts = [config.share_no_tool, config.share_fix, config.share_copy_error]
    out = []
    for _ in range(n):
        u, style = rng.random(), "clean"
        for name, share in zip(TRAJECTORY_STYLES[1:], cuts, strict=True):
            if u < share:
                style = name
                break
            u -= share
        out.append(style)
    return out


def scripted_trajectories(
    problems: Sequence[Problem], sandbox: Sandbox, config: SolverConfig, *, seed: int
) -> list[dict[str, Any]]:
    """SFT rows (`messages`, `tools`, plus `style` and `problem_id`) in the Open-AgentRL SFT schema."""
    rng = random.Random(seed)
    styles = choose_styles(len(problems), config, seed=seed + 1)
    first = [
        (_typo(rng, p.expression) if s == "fix" else f"print({p.expression})")
        for p, s in zip(problems, styles, strict=True)
    ]
    fixes = [k for k, s in enumerate(styles) if s == "fix"]
    results = run_with_progress(sandbox, first + [f"print({problems[k].expression})" for k in fixes])
    first_res, fix_res = results[: len(problems)], dict(zip(fixes, results[len(problems) :], strict=True))

    def shown(r: Any) -> str:
        return truncate_middle(
            format_tool_output(r.stdout, r.stderr, timed_out=r.timed_out), config.max_tool_response_chars
        )

    rows = []
    for k, (p, style) in enumerate(zip(problems, styles, strict=True)):
        msgs: list[dict[str, Any]] = [{"role": "user", "content": p.question}]
        if style == "no_tool":
            msgs.append(
                {
                    "role": "assistant",
                    "content": f"I can do this in my head. The answer is \\boxed{{{_guess(rng, p.answer)}}}.",
                }
            )
        else:
            # no preamble: the code follows the question closely, which a tiny model learns to copy much sooner
            msgs.append({"role": "assistant", "content": "", "tool_calls": [code_call(first[k])]})
            msgs.append({"role": "tool", "content": shown(first_res[k])})
            out = first_res[k]
            if style == "fix":
                msgs.append(
                    {
                        "role": "assistant",
                        "content": "The code failed. Let me fix it.",
                        "tool_calls": [code_call(f"print({p.expression})")],
                    }
                )
                out = fix_res[k]
                msgs.append({"role": "tool", "content": shown(out)})
            value = out.stdout.strip()
            if out.status != "ok" or not value:
                raise RuntimeError(f"the sandbox failed on the solver's own code for {p.id}: {out}")
            if style == "copy_error":
                value = _corrupt_digit(rng, value)
            msgs.append({"role": "assistant", "content": f"The answer is \\boxed{{{value}}}."})
        rows.append(
            {"messages": msgs, "tools": [CODE_INTERPRETER_SCHEMA], "style": style, "problem_id": p.id}
        )
    return rows
