"""Stitched tool trajectories from GSM8K's human solutions: each calculator annotation (`<<48/2=24>>`) becomes
Python run in the real sandbox through a `code_interpreter` call, then the gold answer in `\\boxed{}`. Three styles
(`StitchConfig.style`): `code`, every step a line of one call and the prose dropped; `text`, the prose kept as the
chain of thought with one call per step where its annotation stood; `plain`, the no-tool arm's rows: the prose
alone, no call.

"She sold 48/2 = <<48/2=24>>24 clips in May. She sold 48+24 = <<48+24=72>>72 clips altogether." becomes

    clips_in_may = 48 / 2
    clips_altogether = 48 + clips_in_may
    print(clips_in_may, clips_altogether)

Shape: ONE call holding every step, no text before it, then "The answer is \\boxed{72}." -- the fewest turns and
tokens, which is what a 135M model learns to copy soonest (the arithmetic demo found the same); one call per step
would multiply the turns (and the chat scaffolding) by GSM8K's 2-9 steps.

Names come from the solution's words, deterministically: the words after the annotation's printed result up to
the clause's end ("24 clips in May." -> clips_in_may), else the last words of the clause before the written
expression ("... because 2 x 16 =" -> largest_pizzas), else step_N; stop words are trimmed from both ends,
Python keywords and builtins get a `_value` suffix, repeats `_2`, `_3`. A literal equal to an earlier step's
result becomes that step's name unless the number is also in the question (then it may be the question's own).

Nothing is copied from the annotation into the tool output: the sandbox runs the code, and a row whose printed
values disagree with the annotations' results (relative tolerance, so 24 and 24.0 agree) is dropped and counted,
as are solutions without annotations, malformed ones, and those whose gold answer is none of the printed values.

The `text` style keeps the solution's sentences in order: the prose up to an annotation, then a call computing that
step alone (`clips_in_may = 48 / 2`, `print(clips_in_may)`: its numbers as literals, since every call runs in a
fresh interpreter and cannot read an earlier call's names), the sandbox's output as the tool turn, and the prose
going on after it ("24 clips in May. Natalia sold 48+24 =" ...), the answer line last. Each call's printed value
must agree with its annotation, and the rows are dropped and counted for the same reasons as the code style's.

The `plain` style writes the solution's sentences as one assistant turn with every annotation removed and the
result kept as the solution writes it ("She sold 48/2 = <<48/2=24>>24 clips" -> "She sold 48/2 = 24 clips"; the
solutions write the arithmetic out before an annotation, in symbols or in words), then the same answer line, and
lists no tools. Its steps are run and checked as the text style's, so it keeps exactly the problems the text style
keeps, and no sandbox output goes into its rows.
"""

from __future__ import annotations

import ast
import builtins
import keyword
import math
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tirl.data.benchmarks import WORDINGS, math_prompt
from tirl.sandbox.types import Sandbox
from tirl.tasks.gsm8k.data import gsm8k_answer
from tirl.tasks.toolcalls import code_call, run_with_progress
from tirl.tools.base import truncate_middle
from tirl.tools.code_interpreter import CODE_INTERPRETER_SCHEMA, format_tool_output

_ANNOTATION = re.compile(r"<<([^<>]*)>>")
_NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?|\.\d+")
_PRINTED = re.compile(
    r"[ \t]*\$?[ \t]*-?(?:\d[\d,]*(?:\.\d+)?|\.\d+)?[ \t]*%?"
)  # the result as the prose prints it after `>>`
_ALLOWED = re.compile(r"[\d.+\-*/()\s]+")
_STOP = frozenset(
    "a an the and or but so then that this these those he she it they we i you his her its their our my your "
    "him them is are was were be been will would can could has have had do does did of to in on at for by with "
    "from as because since which who there here if thus therefore means now also all still".split()
)
NAME_WORDS = 3  # the most words a name keeps
DROP_REASONS = (
    "no annotations",
    "more steps than max_steps",
    "malformed annotation",
    "sandbox error",
    "disagrees with annotation",
    "answer not among the values",
)


class StitchError(ValueError):
    """A solution that cannot become a trajectory; `reason` is one of DROP_REASONS."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


@dataclass(frozen=True)
class Step:
    """One calculator step: `name = expression` in Python; `result` is the annotation's claimed value."""

    name: str
    expression: str
    result: float


@dataclass
class StitchConfig:
    max_steps: int = 0  # keep solutions with at most this many annotations (0: any number)
    wording: str = "recipe"  # the user turn as `tirl data prepare gsm8k --wording` writes it
    max_tool_response_chars: int = 256  # as the solver's
    rel_tol: float = 1e-6  # printed value vs the annotation's result
    style: str = "code"  # one of STYLES (below, with their registry)

    def __post_init__(self) -> None:
        if self.style not in STYLES:
            raise ValueError(f"unknown stitch style {self.style!r}; valid: {', '.join(STYLES)}")
        if self.max_steps < 0:
            raise ValueError(f"max_steps must be >= 0 (0: no limit), got {self.max_steps}")
        if self.wording not in WORDINGS:
            raise ValueError(f"unknown wording {self.wording!r}; valid: {', '.join(WORDINGS)}")


@dataclass
class StitchReport:
    kept: int = 0
    dropped: Counter = field(default_factory=Counter)  # reason -> rows
    steps: Counter = field(default_factory=Counter)  # steps -> kept rows

    @property
    def total(self) -> int:
        return self.kept + sum(self.dropped.values())


def _number(text: str) -> float:
    return float(text.replace(",", "").replace("$", "").strip())


def to_python(expr: str) -> ast.expr:
    """An annotation's left side as a Python expression: 1,200 -> 1200, 20% -> (20/100), x and × -> *."""
    e = re.sub(r"(?<=\d),(?=\d{3}(?!\d))", "", expr.strip())
    e = re.sub(r"(\d*\.?\d+)\s*%", r"(\1/100)", e)
    e = e.replace("×", "*").replace("÷", "/").replace("−", "-").replace("^", "**")
    e = re.sub(r"(?<=[\d)\s])x(?=[\s\d(])", "*", e)
    if not e or not _ALLOWED.fullmatch(e):
        raise StitchError("malformed annotation", f"not arithmetic: {expr!r}")
    try:
        return ast.parse(e, mode="eval").body
    except SyntaxError:
        raise StitchError("malformed annotation", f"does not parse: {expr!r}") from None


def _trim(words: list[str]) -> list[str]:
    while words and words[0] in _STOP:
        words = words[1:]
    while words and words[-1] in _STOP:
        words = words[:-1]
    return words


def _words(clause: str) -> list[str]:
    return re.findall(r"[a-z]+", clause.lower().replace("'s", "").replace("’s", ""))


def _words_after(text: str) -> list[str]:
    rest = text[_PRINTED.match(text).end() :]
    clause = re.split(r"[.,;:!?\n()=<]|\d", rest, maxsplit=1)[0]
    return _trim(_words(clause)[:NAME_WORDS])


def _words_before(text: str) -> list[str]:
    tokens = text.split()
    while tokens and re.fullmatch(r"[\d.,$%+\-*/x×÷=()]+", tokens[-1]):  # the written expression
        tokens.pop()
    clause = re.split(r"[;:!?\n()=]|[.,](?!\d)", " ".join(tokens))[-1]  # 1,200 and 0.5 do not end it
    return _trim(_words(clause)[-NAME_WORDS:])


def step_name(before: str, after: str, index: int, taken: set[str]) -> str:
    """A valid, unused identifier for step `index` (1-based) from the prose around its annotation."""
    words = _words_after(after) or _words_before(before)
    name = "_".join(words) or f"step_{index}"
    if keyword.iskeyword(name) or hasattr(builtins, name):
        name += "_value"
    base, k = name, 2
    while name in taken:
        name, k = f"{base}_{k}", k + 1
    taken.add(name)
    return name


class _Substitute(ast.NodeTransformer):
    """Literals equal to an earlier step's result become its name (the latest such step)."""

    def __init__(self, names: dict[float, str]) -> None:
        self.names = names

    def visit_Constant(self, node: ast.Constant) -> ast.AST:
        name = self.names.get(node.value) if isinstance(node.value, (int, float)) else None
        return ast.Name(id=name, ctx=ast.Load()) if name else node


def parse_solution(solution: str, question: str = "", *, by_name: bool = True) -> list[Step]:
    """The annotated steps of a GSM8K solution, named, with earlier results referenced by name (`by_name`) or
    left as the literals the annotation wrote."""
    in_question = {_number(n) for n in _NUMBER.findall(question)}
    steps: list[Step] = []
    taken: set[str] = set()
    names: dict[float, str] = {}
    matches = list(_ANNOTATION.finditer(solution))
    for k, m in enumerate(matches):
        lhs, eq, rhs = m.group(1).rpartition("=")
        if not eq:
            raise StitchError("malformed annotation", f"no '=' in <<{m.group(1)}>>")
        try:
            result = _number(rhs)
        except ValueError:
            raise StitchError("malformed annotation", f"result is not a number: <<{m.group(1)}>>") from None
        line_start = solution.rfind("\n", 0, m.start()) + 1
        start = max(line_start, matches[k - 1].end() if k else 0)
        name = step_name(solution[start : m.start()], solution[m.end() :], k + 1, taken)
        tree = _Substitute(names).visit(to_python(lhs)) if by_name else to_python(lhs)
        steps.append(Step(name, ast.unparse(tree), result))
        if result not in in_question:
            names[result] = name
    return steps


def step_code(steps: Sequence[Step]) -> str:
    """One assignment per step, then one print of every value in order."""
    return "\n".join(
        [*(f"{s.name} = {s.expression}" for s in steps), f"print({', '.join(s.name for s in steps)})"]
    )


def prose_segments(solution: str) -> list[str]:
    """The solution's text around its annotations, before `####`: one more segment than annotations (the text up
    to the first, between each two, after the last), annotations removed."""
    body = solution.split("####")[0]
    cuts = [0, *(i for m in _ANNOTATION.finditer(body) for i in (m.start(), m.end())), len(body)]
    return [body[cuts[k] : cuts[k + 1]] for k in range(0, len(cuts), 2)]


def text_step_code(step: Step) -> str:
    """A text-style call: one step with its numbers as literals, and its value printed."""
    return f"{step.name} = {step.expression}\nprint({step.name})"


def _printed_values(stdout: str, n: int) -> list[float] | None:
    parts = stdout.split()
    try:
        values = [float(p) for p in parts]
    except ValueError:
        return None
    return values if len(values) == n else None


def _values(result: Any, n: int) -> list[float]:
    """The `n` numbers a run printed; StitchError if it failed or printed anything else."""
    if result.status != "ok":
        raise StitchError("sandbox error", result.status)
    values = _printed_values(result.stdout, n)
    if values is None:
        raise StitchError("sandbox error", f"unexpected output {result.stdout[:80]!r}")
    return values


def check_values(steps: Sequence[Step], values: Sequence[float], gold: str, rel_tol: float) -> None:
    """Raise StitchError unless every step's printed value is its claimed result and the gold is one of them."""
    close = lambda a, b: math.isclose(a, b, rel_tol=rel_tol, abs_tol=1e-9)  # noqa: E731
    for s, v in zip(steps, values, strict=True):
        if not close(v, s.result):
            raise StitchError(
                "disagrees with annotation", f"{s.name} = {s.expression} printed {v}, not {s.result}"
            )
    if not any(close(v, _number(gold)) for v in values):
        raise StitchError("answer not among the values", gold)


def _plan(record: dict[str, Any], config: StitchConfig) -> tuple[list[Step], str]:
    steps = parse_solution(record["answer"], record["question"], by_name=config.style == "code")
    if not steps:
        raise StitchError("no annotations")
    if config.max_steps and len(steps) > config.max_steps:
        raise StitchError("more steps than max_steps", str(len(steps)))
    return steps, gsm8k_answer(record["answer"])


def _code_row(
    record: dict[str, Any],
    pid: str,
    codes: Sequence[str],
    outputs: Sequence[str],
    gold: str,
    config: StitchConfig,
) -> dict:
    """The code style's row: one call with every step, its output, the answer line."""
    (code,), (output,) = codes, outputs
    msgs = [
        {"role": "user", "content": math_prompt(record["question"], config.wording)},
        {"role": "assistant", "content": "", "tool_calls": [code_call(code)]},
        {"role": "tool", "content": truncate_middle(output, config.max_tool_response_chars)},
        {"role": "assistant", "content": f"The answer is \\boxed{{{gold}}}."},
    ]
    return {"messages": msgs, "tools": [CODE_INTERPRETER_SCHEMA], "style": "stitched", "problem_id": pid}


def _text_row(
    record: dict[str, Any],
    pid: str,
    codes: Sequence[str],
    outputs: Sequence[str],
    gold: str,
    config: StitchConfig,
) -> dict:
    """The text style's row: each prose segment, then its step's call and output; the last segment and the
    answer line close it."""
    *segments, tail = [s.strip() for s in prose_segments(record["answer"])]
    msgs = [{"role": "user", "content": math_prompt(record["question"], config.wording)}]
    for text, code, output in zip(segments, codes, outputs, strict=True):
        msgs.append({"role": "assistant", "content": text, "tool_calls": [code_call(code)]})
        msgs.append({"role": "tool", "content": truncate_middle(output, config.max_tool_response_chars)})
    answer = f"The answer is \\boxed{{{gold}}}."
    msgs.append({"role": "assistant", "content": f"{tail}\n{answer}" if tail else answer})
    return {
        "messages": msgs, "tools": [CODE_INTERPRETER_SCHEMA], "style": "stitched-text", "problem_id": pid,
    }  # fmt: skip


def _plain_row(
    record: dict[str, Any],
    pid: str,
    codes: Sequence[str],
    outputs: Sequence[str],
    gold: str,
    config: StitchConfig,
) -> dict:
    """The plain style's row: the solution's text without its annotations, the answer line; no call, no tools."""
    body = "".join(prose_segments(record["answer"])).strip()
    answer = f"The answer is \\boxed{{{gold}}}."
    msgs = [
        {"role": "user", "content": math_prompt(record["question"], config.wording)},
        {"role": "assistant", "content": f"{body}\n{answer}" if body else answer},
    ]
    return {"messages": msgs, "tools": [], "style": "stitched-plain", "problem_id": pid}


def _code_values(steps: Sequence[Step], results: Sequence[Any]) -> list[float]:
    return _values(results[0], len(steps))


def _text_values(steps: Sequence[Step], results: Sequence[Any]) -> list[float]:
    return [_values(r, 1)[0] for r in results]


@dataclass(frozen=True)
class _Style:
    """How a style turns steps into calls, reads back what they printed, and writes the row."""

    codes: Callable[[Sequence[Step]], list[str]]
    values: Callable[[Sequence[Step], Sequence[Any]], list[float]]
    row: Callable[..., dict]


_STYLES = {
    "code": _Style(lambda steps: [step_code(steps)], _code_values, _code_row),
    "text": _Style(lambda steps: [text_step_code(s) for s in steps], _text_values, _text_row),
    "plain": _Style(lambda steps: [text_step_code(s) for s in steps], _text_values, _plain_row),
}
# one call with every step, prose dropped | the prose with one call per step | the prose alone, no tool
STYLES = tuple(_STYLES)


def stitch_rows(
    records: Sequence[dict[str, Any]], ids: Sequence[str], sandbox: Sandbox, config: StitchConfig
) -> tuple[list[dict[str, Any]], StitchReport]:
    """SFT rows (the solver's schema plus `steps`) for the records that survive, and the counts of those that
    did not. Every kept row's tool output is the sandbox's own."""
    report = StitchReport()
    planned: list[tuple[int, list[Step], str]] = []
    for i, rec in enumerate(records):
        try:
            planned.append((i, *_plan(rec, config)))
        except StitchError as e:
            report.dropped[e.reason] += 1
    style = _STYLES[config.style]
    codes = [style.codes(steps) for _, steps, _ in planned]
    flat = run_with_progress(sandbox, [c for cs in codes for c in cs], label="stitched rows")
    rows, start = [], 0
    for (i, steps, gold), calls in zip(planned, codes, strict=True):
        results, start = flat[start : start + len(calls)], start + len(calls)
        try:
            check_values(steps, style.values(steps, results), gold, config.rel_tol)
        except StitchError as e:
            report.dropped[e.reason] += 1
            continue
        outputs = [format_tool_output(r.stdout, r.stderr, timed_out=r.timed_out) for r in results]
        rows.append({**style.row(records[i], ids[i], calls, outputs, gold, config), "steps": len(steps)})
        report.kept += 1
        report.steps[len(steps)] += 1
    return rows, report
