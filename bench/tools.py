"""The code interpreter through the tool API against the sandbox called directly, in one run.

A rollout step's code calls go to the sandbox as one batch in both cases: (a) `ToolSet.execute` with the task's
tools (name dispatch, argument checks, output formatting and truncation, the sandbox batch); (b) the pre-tool-API
path: `prepare_code` and one `sandbox.run_batch`, formatting and truncating each output. Same pool, same snippets
(64 per step, alternated a/b/a/b over `--steps` steps). Writes bench/results/tools.json, or `--out`. Usage:
  python -m bench.tools [--steps N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from bench.common import cli as common_cli
from tirl.chat.tool_formats.hermes import call_json, parse_tool_calls
from tirl.sandbox import LocalSandbox, SandboxConfig
from tirl.tools import CodeInterpreter, ToolSet
from tirl.tools.base import truncate_middle
from tirl.tools.code_interpreter import format_tool_output, prepare_code

CALLS = 64


def direct(sandbox: LocalSandbox, codes: list[str]) -> list[str]:
    results = sandbox.run_batch([prepare_code(c) for c in codes])
    return [truncate_middle(format_tool_output(r.stdout, r.stderr, timed_out=r.timed_out)) for r in results]


def main(steps: int) -> dict:
    codes = [f"{i} * {i + 7}" for i in range(CALLS)]
    calls = [parse_tool_calls(f"<tool_call>\n{call_json('code_interpreter', {'code': c})}\n</tool_call>")[0]
             for c in codes]  # fmt: skip
    tools = ToolSet([CodeInterpreter()])
    times: dict[str, list[float]] = {"tool_api": [], "direct": []}
    with LocalSandbox(SandboxConfig()) as sandbox:
        direct(sandbox, codes)  # warm the pool
        for _ in range(steps):
            t0 = time.perf_counter()
            a = [o.text for o in tools.execute(calls, sandbox)]
            times["tool_api"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            b = direct(sandbox, codes)
            times["direct"].append(time.perf_counter() - t0)
            assert a == b, "the two paths must give the model the same text"
    out = {
        "load_average_at_start": os.getloadavg()[0],
        "calls_per_step": CALLS,
        "steps": steps,
        **{f"{k}_median_s": statistics.median(v) for k, v in times.items()},
    }
    out["tool_api_over_direct"] = out["tool_api_median_s"] / out["direct_median_s"]
    return out


def cli(argv: list[str] | None = None) -> None:
    def arguments(ap: argparse.ArgumentParser) -> None:
        ap.add_argument(
            "--steps", type=int, default=20, help="steps of 64 calls, each path timed once per step"
        )

    common_cli("tools", __doc__, lambda args: main(args.steps), argv, arguments=arguments)


if __name__ == "__main__":
    cli()
