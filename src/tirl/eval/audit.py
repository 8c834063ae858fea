"""The lucky-guess audit: false arithmetic in the reasoning of correct answers, and where the final number came from.

A correct final answer can rest on reasoning with errors that cancel (the "CoT validity" critique of large-k
pass@k). This module finds explicit arithmetic statements in the written reasoning (chains such as
`195 + 367 + 562 + 900 = 2024`, products, powers, `\\frac{a}{b}`) and checks them exactly.

Safety: model text is never `eval`-ed. A candidate is parsed with `ast` in "eval" mode and walked by a
whitelist evaluator over Fractions (numbers, + - * / **, unary signs, parentheses); exponents and result sizes
are bounded, so `9**9**9` is rejected, not computed. What counts as a statement (the rules are conservative, to
avoid false alarms): a maximal run of digits, operators, parentheses and `=` with at least one operator, not
glued to a letter or a variable (`x + 3 = 7`, `f(2) = 5`, `2x = 6`, `50% = 0.5` are skipped). A side written as
a finite decimal is taken as rounded: `1/3 = 0.333` is true (within half a unit of its last digit).

Not here: `≈`, inequalities, implicit multiplication, units, variables; and no judgement of the reasoning beyond
its arithmetic.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from fractions import Fraction

MAX_EXPR_CHARS = 200
MAX_EXPONENT = 256
MAX_BITS = 4096

_LATEX = [
    (re.compile(r"\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}"), r"((\1)/(\2))"),
    (re.compile(r"\^\s*\{([^{}]*)\}"), r"**(\1)"),
    (re.compile(r"\\left|\\right|\\,|\\;|\\!|\$"), ""),
    (re.compile(r"\\[\[\]()]"), " "),  # display and inline math delimiters
    (re.compile(r"\\times|\\cdot|×|·|⋅|∗"), "*"),
    (re.compile(r"\\div|÷"), "/"),
    (re.compile(r"−|–"), "-"),
    (re.compile(r"\^"), "**"),
]
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
_CODE = re.compile(r"<tool_call>.*?(</tool_call>|$)|```.*?(```|$)", re.S)
_RUN = re.compile(r"[0-9.+\-*/() =]+")
_OPERATOR = re.compile(r"\d\s*(\*\*|[-+*/])\s*[\d(]|\)\s*(\*\*|[-+*/])")
_BAD_BEFORE = re.compile(r"[A-Za-z0-9_%)\]}.\\^!]")
_BAD_AFTER = re.compile(r"[A-Za-z0-9_(%!^\\]")
_DECIMAL = re.compile(r"^\s*[-+]?\d+\.(\d+)\s*$")


class UnsafeExpression(ValueError):
    """The text is not a plain bounded arithmetic expression."""


@dataclass(frozen=True)
class Statement:
    text: str  # the normalised chain, e.g. "195 + 367 + 562 + 900 = 2024"
    values: tuple[Fraction, ...]  # each side's exact value
    true: bool


def safe_eval(expr: str) -> Fraction:
    """Exact value of a plain arithmetic expression; UnsafeExpression for anything else (never eval)."""
    if len(expr) > MAX_EXPR_CHARS:
        raise UnsafeExpression(f"longer than {MAX_EXPR_CHARS} characters")
    source = expr.strip()
    try:
        tree = ast.parse(source, mode="eval")
    except SyntaxError as e:
        raise UnsafeExpression(f"not an expression: {e.msg}") from None
    return _eval(tree.body, source)


def _check(x: Fraction) -> Fraction:
    if x.numerator.bit_length() > MAX_BITS or x.denominator.bit_length() > MAX_BITS:
        raise UnsafeExpression("value too large")
    return x


_FLOAT_LITERAL = re.compile(r"[0-9_]*\.?[0-9_]*(?:[eE]([-+]?[0-9_]+))?")


def _float_literal(node: ast.Constant, source: str) -> Fraction:
    """A decimal literal's exact value from its source text (a float would round `0.333...3` past 16 digits)."""
    text = ast.get_source_segment(source, node) or ""
    m = _FLOAT_LITERAL.fullmatch(text)
    if not m or not text:
        raise UnsafeExpression(f"unexpected number literal {text!r}")
    if m.group(1) and abs(int(m.group(1).replace("_", ""))) > MAX_EXPONENT:
        raise UnsafeExpression("decimal exponent too large")  # 1e999999 would build a huge integer
    return Fraction(text.replace("_", ""))


def _eval(node: ast.AST, source: str) -> Fraction:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return _check(_float_literal(node, source) if isinstance(node.value, float) else Fraction(node.value))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        v = _eval(node.operand, source)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp):
        a, b = _eval(node.left, source), _eval(node.right, source)
        if isinstance(node.op, ast.Add):
            return _check(a + b)
        if isinstance(node.op, ast.Sub):
            return _check(a - b)
        if isinstance(node.op, ast.Mult):
            return _check(a * b)
        if isinstance(node.op, ast.Div):
            if b == 0:
                raise UnsafeExpression("division by zero")
            return _check(a / b)
        if isinstance(node.op, ast.Pow):
            if b.denominator != 1 or abs(b.numerator) > MAX_EXPONENT:
                raise UnsafeExpression("exponent not a small integer")
            if a == 0 and b < 0:
                raise UnsafeExpression("division by zero")
            if a.numerator.bit_length() * abs(b.numerator) > MAX_BITS:
                raise UnsafeExpression("power too large")
            return _check(a**b.numerator)
    raise UnsafeExpression(f"{type(node).__name__} is not allowed")


def normalise(text: str) -> str:
    """LaTeX and Unicode arithmetic to Python operators; thousands separators removed; code blocks dropped."""
    text = _CODE.sub(" ", text)
    for pattern, repl in _LATEX:
        text = pattern.sub(repl, text)
    return _THOUSANDS.sub("", text)


def _equal(a: Fraction, b: Fraction, a_text: str, b_text: str) -> bool:
    """Exact, except that a side written as a finite decimal stands for any value that rounds to it."""
    if a == b:
        return True
    tol = Fraction(0)
    for side in (a_text, b_text):
        m = _DECIMAL.match(side)
        if m:
            tol = max(tol, Fraction(1, 2 * 10 ** len(m.group(1))))
    return tol > 0 and abs(a - b) <= tol


def _unwrap(side: str, paren: str, other: str) -> str:
    """Drop parentheses that open a chain (or close it) without a partner inside the same side.

    One pass with a running count (linear: a run of 100k "(" must not cost 100k recounts)."""
    excess = side.count(paren) - side.count(other)
    chars = side if paren == "(" else side[::-1]
    i = 0
    while i < len(chars) and chars[i] == paren and excess > 0:
        i += 1
        excess -= 1
        while i < len(chars) and chars[i] in " .":
            i += 1
    if i == 0:
        return side
    rest = chars[i:] if paren == "(" else chars[i:][::-1]
    return rest.strip(" .")


def find_statements(text: str) -> list[Statement]:
    """Every arithmetic chain in `text` that can be checked, each with its verdict."""
    text = normalise(text)
    out = []
    for m in _RUN.finditer(text):
        raw = m.group(0)
        run = raw.lstrip(" ")
        start = m.start() + len(raw) - len(run)
        run = run.rstrip(" .(")
        if "=" not in run or not _OPERATOR.search(run):
            continue
        end = start + len(run)
        before = text[start - 1] if start > 0 else ""
        after = text[end] if end < len(text) else ""
        if before and _BAD_BEFORE.match(before) or after and _BAD_AFTER.match(after):
            continue
        sides = [s.strip() for s in run.split("=")]
        sides[0], sides[-1] = _unwrap(sides[0], "(", ")"), _unwrap(sides[-1], ")", "(")  # "(2 * 3 = 6)"
        if len(sides) < 2 or any(not s for s in sides) or sides[0][0] in "+*/)":
            continue
        try:
            values = tuple(safe_eval(s) for s in sides)
        except UnsafeExpression:
            continue
        true = all(_equal(values[i], values[i + 1], sides[i], sides[i + 1]) for i in range(len(values) - 1))
        out.append(Statement(" = ".join(sides), values, true))
    return out


_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?(?:/\d+)?")


def numbers_in(text: str) -> set[Fraction]:
    """Every number literal in a text (integers, decimals, a/b), as exact values."""
    out = set()
    for tok in _NUMBER.findall(_THOUSANDS.sub("", text)):
        try:
            out.add(Fraction(tok))
        except (ValueError, ZeroDivisionError):
            continue
    return out


def answer_value(answer: str | None) -> Fraction | None:
    """The exact value of a final answer if it is a plain number or fraction, else None."""
    if answer is None:
        return None
    try:
        return safe_eval(normalise(answer).replace(" ", ""))
    except UnsafeExpression:
        return None


def answer_source(answer: str | None, tool_outputs: list[str]) -> str:
    """ "tool" if the final number appears in a successful tool output, "text" otherwise, "n/a" if not a number."""
    value = answer_value(answer)
    if value is None:
        return "n/a"
    return "tool" if any(value in numbers_in(o) for o in tool_outputs) else "text"
