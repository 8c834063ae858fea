"""The benchmarks' rows are graded through `tirl.rewards` alone, with no task imported: the registry holds their
routes itself (the benchmark tasks declare the same tuples: tests/tasks/test_benchmark_tasks.py)."""

from __future__ import annotations

import json
import subprocess
import sys

ROUTES = {
    "math500": "math",
    "aime24": "integer",
    "aime25": "integer",
    "AIME2024": "integer",
    "amc23": "integer",
    "gpqa_diamond": "choice",
    "humaneval": "code",
    "LiveCodeBench_v6": "code",
}


def test_benchmark_sources_are_routed_without_tirl_tasks():
    code = (
        "import json, sys, tirl.rewards.registry as r\n"
        f"names = {{s: r.verifier_name(s) for s in {list(ROUTES)!r}}}\n"
        "print(json.dumps([names, sorted(m for m in sys.modules if m.startswith('tirl.tasks'))]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    names, tasks = json.loads(out)
    assert tasks == [] and names == ROUTES


def test_a_math500_row_grades_with_rewards_alone():
    code = (
        "import sys\n"
        "from tirl.rewards.batch import grade_many\n"
        "from tirl.rewards.registry import verifier_name\n"
        "g = grade_many([(verifier_name('math500'), 'so \\\\boxed{\\\\frac{1}{2}}', '\\\\frac12')], workers=1)[0]\n"
        "print(g.correct, any(m.startswith('tirl.tasks') for m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["True", "False"]
