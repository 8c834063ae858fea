"""The demo task: arithmetic word problems that a tiny model cannot do in its head, but can with a Python tool.

Problems have exact integer answers and three difficulty levels (products of multi-digit numbers, sums of several
large numbers, modular arithmetic). Each problem carries the Python expression that solves it, so the scripted solver
(`tirl.tasks.arith.solver`) can write tool calls whose outputs come from the real sandbox.

Not a benchmark: it exists so that every stage of the loop can be shown working on two CPU cores in minutes.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

# Each template: (question with {a} {b} {c} {m} slots, python expression over the same names).
# Plain questions state the expression; word problems hide it in a sentence (much slower for a tiny model to learn
# to copy into code, so the demo uses plain ones). Kept short: every prompt token costs compute on every step.
_PLAIN: dict[str, tuple[str, str]] = {
    "mul": ("What is {a} * {b}?", "{a} * {b}"),
    "sum": ("What is {a} + {b} + {c}?", "{a} + {b} + {c}"),
    "muladd": ("What is {a} * {b} + {c}?", "{a} * {b} + {c}"),
    "mod": ("What is {a} * {b} mod {m}?", "({a} * {b}) % {m}"),
}
_WORD: dict[str, list[tuple[str, str]]] = {
    "mul": [
        ("A shop has {a} boxes with {b} pens each. How many pens are there?", "{a} * {b}"),
        ("A field has {a} rows of {b} trees. How many trees are there?", "{a} * {b}"),
    ],
    "sum": [
        ("A train goes {a} km, then {b} km, then {c} km. How far does it go?", "{a} + {b} + {c}"),
        ("Three farms grow {a}, {b} and {c} apples. How many apples in total?", "{a} + {b} + {c}"),
    ],
    "muladd": [
        ("There are {a} crates of {b} eggs and {c} loose eggs. How many eggs are there?", "{a} * {b} + {c}")
    ],
    "mod": [("What is the remainder when {a} * {b} is divided by {m}?", "({a} * {b}) % {m}")],
}
STYLES = ("plain", "word", "mixed")

# Digits per operand for each level: (digits of a, digits of b, digits of c, digits of m).
_LEVELS: dict[int, dict[str, tuple[int, int, int, int]]] = {
    1: {"mul": (3, 2, 0, 0), "sum": (4, 4, 4, 0), "muladd": (2, 2, 3, 0), "mod": (3, 2, 0, 2)},
    2: {"mul": (4, 3, 0, 0), "sum": (5, 5, 5, 0), "muladd": (3, 3, 4, 0), "mod": (4, 3, 0, 2)},
    3: {"mul": (5, 4, 0, 0), "sum": (6, 6, 6, 0), "muladd": (4, 3, 5, 0), "mod": (5, 4, 0, 3)},
}
LEVELS = tuple(_LEVELS)
KINDS = tuple(_PLAIN)


@dataclass(frozen=True)
class Problem:
    """One arithmetic word problem; `expression` is the Python that computes `answer`."""

    id: str
    question: str
    expression: str
    answer: int
    kind: str
    level: int

    def to_row(self) -> dict:
        """A row in the verl/Open-AgentRL RL schema (prompt as chat messages, reward_model.ground_truth)."""
        return {
            "data_source": "tirl/arith",
            "prompt": [{"role": "user", "content": self.question}],
            "ability": "math",
            "reward_model": {"ground_truth": str(self.answer), "style": "rule"},
            "extra_info": {
                "id": self.id,
                "kind": self.kind,
                "level": self.level,
                "expression": self.expression,
            },
        }


def _number(rng: random.Random, digits: int) -> int:
    return rng.randint(10 ** (digits - 1), 10**digits - 1)


def _templates(kind: str, style: str) -> list[tuple[str, str]]:
    if style not in STYLES:
        raise ValueError(f"unknown question style {style!r}; valid styles: {list(STYLES)}")
    plain = [_PLAIN[kind]]
    return plain if style == "plain" else _WORD[kind] if style == "word" else plain + _WORD[kind]


def make_problem(rng: random.Random, *, level: int, kind: str, pid: str, style: str = "plain") -> Problem:
    if level not in _LEVELS:
        raise ValueError(f"unknown level {level}; valid levels: {list(_LEVELS)}")
    if kind not in _PLAIN:
        raise ValueError(f"unknown kind {kind!r}; valid kinds: {list(_PLAIN)}")
    da, db, dc, dm = _LEVELS[level][kind]
    values = {
        "a": _number(rng, da),
        "b": _number(rng, db),
        "c": _number(rng, dc) if dc else 0,
        "m": _number(rng, dm) if dm else 1,
    }
    question, expr = rng.choice(_templates(kind, style))
    expression = expr.format(**values)
    answer = eval(expression, {"__builtins__": {}})  # our own template of integer literals, never model text
    return Problem(pid, question.format(**values), expression, int(answer), kind, level)


def generate_problems(
    n: int,
    *,
    seed: int,
    levels: tuple[int, ...] = LEVELS,
    prefix: str = "p",
    style: str = "plain",
    exclude: set[str] | frozenset[str] = frozenset(),
) -> list[Problem]:
    """`n` distinct problems, cycling over levels and kinds; questions in `exclude` are never produced."""
    rng = random.Random(seed)
    seen = set(exclude)
    out: list[Problem] = []
    i = 0
    while len(out) < n:
        level = levels[i % len(levels)]
        kind = KINDS[(i // len(levels)) % len(KINDS)]
        i += 1
        p = make_problem(rng, level=level, kind=kind, pid=f"{prefix}{len(out)}", style=style)
        if p.question in seen:
            continue
        seen.add(p.question)
        out.append(p)
    return out


def split_problems(
    *,
    seed: int,
    num_sft: int,
    num_rl: int,
    num_test: int,
    levels: tuple[int, ...] = LEVELS,
    style: str = "plain",
) -> tuple[list[Problem], list[Problem], list[Problem]]:
    """Disjoint SFT, RL and held-out test problems (no question text in common)."""
    test = generate_problems(num_test, seed=seed + 2, levels=levels, prefix="test-", style=style)
    held = {p.question for p in test}
    sft = generate_problems(num_sft, seed=seed, levels=levels, prefix="sft-", style=style, exclude=held)
    held |= {p.question for p in sft}
    rl = generate_problems(num_rl, seed=seed + 1, levels=levels, prefix="rl-", style=style, exclude=held)
    return sft, rl, test
