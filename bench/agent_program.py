"""What an agent program costs per rollout batch: tirl's own agent loop against the same episodes run through
`agent.program.command` (examples/openai_agent on the official OpenAI client, against the policy endpoint), one
process per episode and as long-lived workers (`agent.program.mode`), same model, prompts and budget, in one run.

The model is the demo's tiny architecture with random weights and no EOS, so every episode is one turn of exactly
`--tokens` sampled tokens in every path (speed only: no answers, no tool calls). 64 episodes (16 prompts x 4), 2
torch threads; the program paths at 4 and 16 episodes at once (the warm-up starts the workers). Writes
bench/results/agent_program.json, or `--out`.

The other two paths run inside tirl's own loop, so what they add is per call and per grade: a tool call through an
MCP server (stdio) against the same function as a function tool, and a verifiers environment's rubric against
tirl's math verifier grading the same 64 answers.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import torch

from bench.common import result_path, stopwatch, tiny_model, tiny_tokenizer, tirl_env, write_result
from tirl.chat.template import ChatRenderer
from tirl.rollout.agent.config import AgentConfig, ProgramConfig
from tirl.rollout.agent.loop import AgentLoop
from tirl.rollout.engines.torch.engine import TorchEngine
from tirl.rollout.gateway.program import ProgramLoop
from tirl.rollout.sampling import SamplingParams
from tirl.sandbox import LocalSandbox, SandboxConfig
from tirl.tools.code_interpreter import CODE_INTERPRETER_SCHEMA

AGENT = Path(__file__).resolve().parents[1] / "examples" / "openai_agent" / "agent.py"


def measure(tokens: int = 32, prompts: int = 16, n: int = 4) -> dict:
    torch.set_num_threads(2)
    tok = tiny_tokenizer()
    model = tiny_model(tok).eval()
    renderer = ChatRenderer(tok, tools=[CODE_INTERPRETER_SCHEMA])
    engine = TorchEngine(
        model, eos_ids=[10**9], pad_id=tok.pad_token_id
    )  # no EOS: every turn runs to `tokens`
    messages = [[{"role": "user", "content": f"What is {1000 + 7 * i} * {37 + i}?"}] for i in range(prompts)]
    batch = [m for m in messages for _ in range(n)]
    params = SamplingParams()
    out: dict = {
        "episodes": len(batch),
        "tokens_per_episode": tokens,
        "model": "tiny demo shape, random weights",
    }
    with LocalSandbox(SandboxConfig(timeout_s=5.0)) as sandbox:
        cfg = AgentConfig(max_response_tokens=tokens, max_tokens_per_turn=tokens)
        loop = AgentLoop(engine, renderer, sandbox, cfg)
        loop.run(batch[:2], params, generator=torch.Generator().manual_seed(0))  # warm-up
        with stopwatch() as t:
            trajs = loop.run(batch, params, generator=torch.Generator().manual_seed(0))
        out["tirl_loop"] = {"seconds": t.s, "sampled_tokens": sum(sum(x.loss_mask) for x in trajs)}
        for mode, concurrency in (("episode", 4), ("episode", 16), ("worker", 4), ("worker", 16)):
            program = ProgramConfig(
                command=f"{sys.executable} {AGENT}", mode=mode, concurrency=concurrency, timeout_s=300
            )
            pcfg = AgentConfig(max_response_tokens=tokens, max_tokens_per_turn=tokens, program=program)
            ploop = ProgramLoop(engine, renderer, sandbox, pcfg, program)
            try:
                ploop.run(batch[:2], params, generator=torch.Generator().manual_seed(0))  # warm-up
                with stopwatch() as t:
                    trajs = ploop.run(batch, params, generator=torch.Generator().manual_seed(0))
            finally:
                ploop.close()
            out[f"program_{mode}_concurrency_{concurrency}"] = {
                "seconds": t.s,
                "sampled_tokens": sum(sum(x.loss_mask) for x in trajs),
                "slowdown_vs_tirl_loop": t.s / out["tirl_loop"]["seconds"],
                "extra_seconds_per_episode": (t.s - out["tirl_loop"]["seconds"]) / len(batch),
                "metrics": ploop.episode_metrics(),
            }
    return out


def tool_calls(calls: int = 64) -> dict:
    """The same tool (examples/mcp_tools' `convert_length`) per call: through its MCP server over stdio against
    the plain function as a tirl function tool, both run by `ToolSet.execute` as the agent loop runs them."""
    from examples.mcp_tools.server import convert_length

    from tirl.chat.tool_formats import ToolCall
    from tirl.tools.base import ToolSet, tool
    from tirl.tools.mcp import McpServer

    args = {"value": 3.5, "from_unit": "km", "to_unit": "yd"}
    batch = [ToolCall("", "convert_length", None, dict(args)) for _ in range(calls)]
    out: dict = {"calls": calls}
    with McpServer([sys.executable, str(AGENT.parents[1] / "mcp_tools" / "server.py")]) as server:
        for name, tools in (
            ("function_tool", [tool(convert_length, sandbox=False)]),
            ("mcp_stdio", server.tools),
        ):
            toolset = ToolSet(tools)
            toolset.execute(batch[:2], None)  # warm-up
            with stopwatch() as t:
                outputs = toolset.execute(batch, None)
            assert all(o.status == "ok" for o in outputs), outputs[0]
            out[name] = {"seconds": t.s, "ms_per_call": 1000 * t.s / calls}
    out["mcp_extra_ms_per_call"] = out["mcp_stdio"]["ms_per_call"] - out["function_tool"]["ms_per_call"]
    return out


def grading(responses: int = 64) -> dict:
    """Grading one step's responses: a verifiers environment's rubric (examples/verifiers_env) against tirl's
    own math verifier on the same answers."""
    from tirl.data.records import ProblemRow
    from tirl.rewards.scoring import Response, grade_responses
    from tirl.rewards.shaping import RewardConfig
    from tirl.tasks import load_task

    task = load_task("verifiers:verifiers-arith")  # examples/verifiers_env on PYTHONPATH (`grading_in_child`)
    rows = task.rows("train", task.options(), 0)
    problems = [ProblemRow.from_row(r, i) for i, r in enumerate(rows)]
    answers = [json.loads(p.ground_truth)["answer"] for p in problems]
    plain = [
        ProblemRow(p.problem_id, "math", p.prompt, a, "math") for p, a in zip(problems, answers, strict=True)
    ]
    out: dict = {"responses": responses}
    for name, rows_ in (("tirl_math_verifier", plain), ("verifiers_rubric", problems)):
        batch = [Response(f"The answer is \\boxed{{{answers[i % len(rows_)]}}}.", rows_[i % len(rows_)], 0, 16)
                 for i in range(responses)]  # fmt: skip
        grade_responses(batch[:2], RewardConfig())  # warm-up
        with stopwatch() as t:
            graded = grade_responses(batch, RewardConfig())
        assert all(g.correct for g in graded), graded[0]
        out[name] = {"seconds": t.s, "ms_per_response": 1000 * t.s / responses}
    return out


def grading_in_child() -> dict:
    """`grading` in a child process whose PYTHONPATH holds examples/verifiers_env, where verifiers finds the
    example environment by its module name."""
    code = "import json, bench.agent_program as b; print(json.dumps(b.grading()))"
    env = tirl_env(AGENT.parents[2], AGENT.parents[1] / "verifiers_env")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.agent_program", description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--out", default=str(result_path("agent_program")))
    args = ap.parse_args(argv)
    res = {
        "agent_program": measure(args.tokens),
        "mcp_tool_calls": tool_calls(),
        "verifiers_grading": grading_in_child(),
    }
    write_result(args.out, res)
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
