"""GSM8K with a calculator tool: a tool that needs no sandbox, written only against tirl's public API.

    tirl rl task=examples.gsm8k_calculator.task:task model.path=MODEL [rl.steps=...]

The calculator parses the model's expression with `ast` and evaluates it over exact fractions, so it never runs
model text as code and is declared `sandbox=False`. Rows are the GSM8K test file tirl ships (first 1000 for RL,
the rest for eval); the answer is graded by the registry's `gsm8k` verifier (routed by data_source).
"""

from __future__ import annotations

import ast
import operator
from fractions import Fraction

from tirl.tasks import Task
from tirl.tasks.gsm8k import prepare_gsm8k
from tirl.tools import tool

_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}


def _value(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return Fraction(str(node.value))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _value(node.operand)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Pow) and (right.denominator != 1 or abs(right) > 64):
            raise ValueError("powers must be whole numbers up to 64")
        return Fraction(_OPS[type(node.op)](left, right))
    raise ValueError(f"only numbers, + - * / // % ** and parentheses are allowed, not {type(node).__name__}")


@tool(sandbox=False)
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression exactly: numbers, + - * / // % ** and parentheses.

    Args:
        expression: The expression, e.g. "(16 - 3 - 4) * 2".
    """
    result = _value(ast.parse(expression.replace(",", ""), mode="eval").body)
    return str(result.numerator) if result.denominator == 1 else f"{result} = {float(result):.6g}"


SYSTEM = "Use the calculator tool for every computation, then give the final answer as \\boxed{number}."


def rows(split: str, options, seed: int) -> list[dict]:
    data = prepare_gsm8k("plain")
    return data[:1000] if split == "train" else data[1000:]


task = Task("gsm8k_calculator", tools=[calculator], system_prompt=SYSTEM, rows=rows)
