"""An agent program written against the OpenAI API, trained by `tirl rl` unchanged (docs/agents.md).

    tirl rl --config src/tirl/configs/demo.yaml model.path=runs/demo/sft/model \
        agent.program.command="python examples/openai_agent/agent.py"

tirl starts it once per episode with OPENAI_BASE_URL pointing at the policy endpoint, and writes the episode to its
stdin: `{"episode": ID, "messages": [...]}` (with `agent.program.mode=worker`, a few long-lived copies take one
episode per line, each with its `base_url`). It asks the model with one tool of its own, a calculator it runs
itself (named `code_interpreter`, taking `print(EXPRESSION)`, the call the demo's model was taught), feeds the
result back, and prints the final answer as `{"answer": ...}`, which the task's verifier grades. It runs no code:
the calculator reads arithmetic only.
"""

from __future__ import annotations

import ast
import json
import operator
import os
import sys

from openai import OpenAI

CALCULATOR = {
    "type": "function",
    "function": {
        "name": "code_interpreter",
        "description": "A calculator: print(EXPRESSION) prints the value of an arithmetic expression.",
        "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]},
    },
}
OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
       ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.USub: operator.neg, ast.UAdd: operator.pos}  # fmt: skip
MAX_TURNS = 4


def value(node: ast.AST) -> float:
    """An arithmetic expression's value; anything else (names, calls, powers) is refused."""
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in OPS:
        return OPS[type(node.op)](value(node.left), value(node.right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in OPS:
        return OPS[type(node.op)](value(node.operand))
    raise ValueError("only + - * / // % on numbers")


def calculate(code: str) -> str:
    text = code.strip()
    if text.startswith("print(") and text.endswith(")"):
        text = text[len("print(") : -1]
    try:
        result = value(ast.parse(text, mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError) as e:
        return f"Error: {e}\n"
    return f"{int(result) if float(result).is_integer() else result}\n"


def solve(client: OpenAI, messages: list[dict]) -> str:
    """One episode: ask, run the calculator calls, feed the results back, until the model answers."""
    answer = ""
    for _ in range(MAX_TURNS):
        reply = client.chat.completions.create(model="policy", messages=messages, tools=[CALCULATOR])
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))  # sent back as it came: tokens stay exact
        answer = message.content or ""
        if not message.tool_calls:
            break
        for call in message.tool_calls:
            try:
                code = json.loads(call.function.arguments).get("code", "")
            except ValueError:
                code = ""
            messages.append({"role": "tool", "tool_call_id": call.id, "content": calculate(str(code))})
    return answer


def main() -> None:
    if os.environ.get("TIRL_PROGRAM_MODE") == "worker":  # agent.program.mode=worker: one episode per line
        for line in sys.stdin:
            episode = json.loads(line)
            answer = solve(OpenAI(base_url=episode["base_url"]), list(episode["messages"]))
            print(json.dumps({"episode": episode["episode"], "answer": answer}), flush=True)
        return
    episode = json.loads(sys.stdin.read())  # OPENAI_BASE_URL is this episode's
    print(json.dumps({"answer": solve(OpenAI(), list(episode["messages"]))}))


if __name__ == "__main__":
    main()
