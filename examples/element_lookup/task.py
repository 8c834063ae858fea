"""Two tools in one task: a lookup over a small table shipped here, and the sandboxed code interpreter.

    tirl rl task=examples.element_lookup.task:task model.path=MODEL [rl.steps=...]

Questions combine facts from `elements.csv` ("What is the atomic mass of carbon times 3?"): the model looks the
facts up with `lookup_element` (in-process, a dictionary read: `sandbox=False`) and computes with
`code_interpreter` (in the sandbox). Its verifier is registered here, from outside tirl: numbers equal to two
decimals, and the same rule groups answers for maj@k.
"""

from __future__ import annotations

import csv
import random
from pathlib import Path
from typing import Literal

from tirl.rewards import GradeResult, last_boxed, register_verifier
from tirl.tasks import Task
from tirl.tools import CodeInterpreter, tool

SOURCE = "examples/elements"
with open(Path(__file__).with_name("elements.csv"), encoding="utf-8") as f:
    TABLE = {r["name"]: r for r in csv.DictReader(f)}


@tool(sandbox=False)
def lookup_element(name: str, field: Literal["symbol", "atomic_number", "atomic_mass"]) -> str:
    """Look up one fact about a chemical element (the first 20 elements).

    Args:
        name: The element's English name, e.g. "carbon".
        field: Which fact to return.
    """
    row = TABLE.get(name.strip().lower())
    return row[field] if row else f"unknown element {name!r}; known: {', '.join(TABLE)}"


def _number(text: str | None) -> float | None:
    try:
        return float(str(text).replace(",", "").strip())
    except (TypeError, ValueError):
        return None


def same_number(a: str, b: str) -> bool:
    x, y = _number(a), _number(b)
    return x is not None and y is not None and round(x, 2) == round(y, 2)


def grade_number(response: str, ground_truth, *, timeout_s: float = 1.0) -> GradeResult:
    pred = last_boxed(response)
    if pred is None:
        return GradeResult(-1.0, False, None, {"no_boxed": True})
    ok = same_number(pred, str(ground_truth))
    return GradeResult(1.0 if ok else -1.0, ok, pred)


register_verifier("element_number", grade_number, timeout_s=1.0, equivalent=same_number, replace=True)


def make_rows(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    names = sorted(TABLE)
    out = []
    for i in range(n):
        a, b = rng.sample(names, 2)
        k = rng.randint(2, 9)
        if i % 2:
            q = f"What is the atomic number of {a} times {k} plus the atomic number of {b}?"
            truth = str(int(TABLE[a]["atomic_number"]) * k + int(TABLE[b]["atomic_number"]))
        else:
            q = f"What is the atomic mass of {a} times {k}? Give two decimals."
            truth = f"{float(TABLE[a]['atomic_mass']) * k:.2f}"
        out.append(
            {
                "data_source": SOURCE,
                "prompt": [{"role": "user", "content": q}],
                "ability": "lookup",
                "reward_model": {"ground_truth": truth},
                "extra_info": {"id": f"el-{seed}-{i}"},
            }
        )
    return out


def rows(split: str, options, seed: int) -> list[dict]:
    return make_rows(200, seed=0) if split == "train" else make_rows(50, seed=1)


task = Task(
    "element_lookup",
    tools=[CodeInterpreter(), lookup_element],
    verifier="element_number",
    data_sources=(SOURCE,),
    system_prompt="Look facts up with lookup_element, compute with code_interpreter, answer as \\boxed{number}.",
    rows=rows,
)
