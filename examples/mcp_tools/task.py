"""A task whose tools come from an MCP server: `server.py` beside this file, started by tirl over stdio.

    tirl rl task=examples.mcp_tools.task:task model.path=MODEL [rl.steps=...]

Questions are about mountain heights in other units ("How tall is Denali in feet?") and plain conversions ("How many
yards are 3.5 km?"): the model looks a height up with `mountain_height` and converts with `convert_length`, both
answered by the MCP server (`tirl.tools.mcp.McpServer`). The server is started once, when this module is imported,
and stopped when the process exits. Its verifier is registered here: a number within 0.5 of the truth, so a whole
number rounded either way is right.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

from examples.mcp_tools.server import HEIGHTS_M, METRES_PER
from tirl.rewards import GradeResult, last_boxed, register_verifier
from tirl.tasks import Task
from tirl.tools.mcp import McpServer

SOURCE = "examples/mountains"
SERVER = McpServer([sys.executable, str(Path(__file__).with_name("server.py"))], name="examples/mcp_tools")


def _number(text: str | None) -> float | None:
    try:
        return float(str(text).replace(",", "").strip())
    except (TypeError, ValueError):
        return None


def close_number(a: str, b: str) -> bool:
    x, y = _number(a), _number(b)
    return x is not None and y is not None and abs(x - y) <= 0.5


def grade_number(response: str, ground_truth, *, timeout_s: float = 1.0) -> GradeResult:
    pred = last_boxed(response)
    if pred is None:
        return GradeResult(-1.0, False, None, {"no_boxed": True})
    ok = close_number(pred, str(ground_truth))
    return GradeResult(1.0 if ok else -1.0, ok, pred)


register_verifier("mountain_number", grade_number, timeout_s=1.0, equivalent=close_number, replace=True)

UNITS = {"ft": "feet", "yd": "yards", "mi": "miles", "km": "kilometres", "m": "metres", "in": "inches"}


def make_rows(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    names = sorted(HEIGHTS_M)
    out = []
    for i in range(n):
        if i % 2:
            name, unit = rng.choice(names), rng.choice(["ft", "yd", "km", "mi"])
            q = f"How tall is {name.title()} in {UNITS[unit]}? Round to a whole number."
            truth = HEIGHTS_M[name] / METRES_PER[unit]
        else:
            value, src, dst = rng.randint(2, 90) / 2, rng.choice(["km", "mi"]), rng.choice(["ft", "yd", "m"])
            q = f"How many {UNITS[dst]} are {value:g} {UNITS[src]}? Round to a whole number."
            truth = value * METRES_PER[src] / METRES_PER[dst]
        out.append(
            {
                "data_source": SOURCE,
                "prompt": [{"role": "user", "content": q}],
                "ability": "lookup",
                "reward_model": {"ground_truth": f"{truth:.2f}"},
                "extra_info": {"id": f"mt-{seed}-{i}"},
            }
        )
    return out


def rows(split: str, options, seed: int) -> list[dict]:
    return make_rows(200, seed=0) if split == "train" else make_rows(50, seed=1)


task = Task(
    "mcp_tools",
    tools=SERVER.tools,
    verifier="mountain_number",
    data_sources=(SOURCE,),
    system_prompt="Look heights up with mountain_height, convert with convert_length, answer as \\boxed{number}.",
    rows=rows,
)
