"""Grade code answers by running their tests in the sandbox: score = fraction of tests passed, correct = all.

The answer is the last ```python block after any `</think>`; one that does not parse scores -1 (as in the
reference recipe), and so does one whose ground truth holds no usable tests (the recipe's -1 for an exception;
details {"error": ...}, so it reads as an error, not a wrong answer). With no block at all, the recipe's fallback applies: a `\boxed{}` answer is graded as math
when the ground truth is a plain answer rather than tests (code-named sources that hold math rows); else -1. Test formats, given as the row's ground truth (a dict or its JSON string):
  - HumanEval: {"prompt", "test", "entry_point"}: one program = prompt (imports, stub) + answer + test +
    `check(entry_point)`; it passes iff it exits cleanly (HumanEval's checks are one `check` function);
  - LiveCodeBench stdin/stdout: {"inputs": [...], "outputs": [...]}: one run per case, stdin = input; passes iff
    the output matches line by line with trailing whitespace ignored (the recipe compares after rstrip("\\n"));
  - LiveCodeBench functional: the same plus "fn_name": each input holds one JSON argument per line; the answer's
    `Solution().fn_name` (or a top-level `fn_name`) is called and its result compared as JSON.
All tests of all answers in a batch go through one `sandbox.run_batch` call with the per-test timeout, so the
tests of one answer run in parallel. Building programs (`build_tests`) and judging results (`judge`) are pure;
only `grade_code_batch` touches the sandbox, which is passed in.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tirl.rewards.math import GradeResult, grade, last_boxed
from tirl.sandbox.types import ExecResult, Sandbox

NO_BLOCK = "no ```python block"
_BLOCK_RE = re.compile(r"```python[^\n]*\n(.*?)```", re.DOTALL)

_FN_HARNESS = """

import json as _tirl_json, sys as _tirl_sys
_tirl_args = [_tirl_json.loads(l) for l in _tirl_sys.stdin.read().splitlines() if l.strip()]
_tirl_fn = Solution().{fn} if "Solution" in globals() else {fn}
print(_tirl_json.dumps(_tirl_fn(*_tirl_args)))
"""


@dataclass(frozen=True)
class CodeTest:
    program: str
    stdin: str | None
    expected: str | None  # None: pass = clean exit (HumanEval); else the expected stdout
    json_output: bool = False  # compare stdout and expected as JSON values (fn_name tests)


def extract_code(response: str) -> tuple[str | None, str | None]:
    """(code, None) for the last ```python block that parses; (None, reason) otherwise."""
    if "</think>" in response:
        response = response.rsplit("</think>", 1)[1]
    blocks = _BLOCK_RE.findall(response)
    if not blocks:
        return None, NO_BLOCK
    code = blocks[-1]
    try:
        ast.parse(code)
    except SyntaxError as e:
        return None, f"does not parse: {e.msg} (line {e.lineno})"
    return code, None


def parse_tests(ground_truth: Any) -> dict[str, Any]:
    spec = json.loads(ground_truth) if isinstance(ground_truth, str) else ground_truth
    if isinstance(spec, dict) and isinstance(
        spec.get("ground_truth"), (str, dict)
    ):  # verl nests it once more
        return parse_tests(spec["ground_truth"])
    if isinstance(spec, dict) and {"test", "entry_point"} <= spec.keys():
        return spec
    if isinstance(spec, dict) and {"inputs", "outputs"} <= spec.keys():
        if not isinstance(spec["inputs"], list) or not isinstance(spec["outputs"], list):
            raise ValueError(
                f"code tests: inputs and outputs must be lists, got {type(spec['inputs']).__name__} and "
                f"{type(spec['outputs']).__name__}"
            )
        if len(spec["inputs"]) != len(spec["outputs"]) or not spec["inputs"]:
            raise ValueError(f"code tests: {len(spec['inputs'])} inputs but {len(spec['outputs'])} outputs")
        return spec
    raise ValueError("code ground truth must hold HumanEval tests (test, entry_point) or inputs/outputs")


def build_tests(code: str, spec: dict[str, Any]) -> list[CodeTest]:
    if "entry_point" in spec:
        program = f"{spec.get('prompt', '')}\n{code}\n\n{spec['test']}\n\ncheck({spec['entry_point']})\n"
        return [CodeTest(program, None, None)]
    fn = spec.get("fn_name")
    if fn:
        if not str(fn).isidentifier():
            raise ValueError(f"code tests: fn_name {fn!r} is not an identifier")
        program = code + _FN_HARNESS.format(fn=fn)
        return [
            CodeTest(program, str(i), str(o), True)
            for i, o in zip(spec["inputs"], spec["outputs"], strict=True)
        ]
    return [CodeTest(code, str(i), str(o)) for i, o in zip(spec["inputs"], spec["outputs"], strict=True)]


def _lines(text: str) -> list[str]:
    return [line.rstrip() for line in text.strip("\n").splitlines()]


def judge(test: CodeTest, result: ExecResult) -> bool:
    if result.status != "ok" or result.exit_code != 0:
        return False
    if test.expected is None:
        return True
    if test.json_output:
        try:
            return json.loads(result.stdout) == json.loads(test.expected)
        except json.JSONDecodeError:
            return False
    return _lines(result.stdout) == _lines(test.expected)


def _summary(code: str, tests: list[CodeTest], results: list[ExecResult]) -> GradeResult:
    passed = [judge(t, r) for t, r in zip(tests, results, strict=True)]
    statuses: dict[str, int] = {}
    for r in results:
        statuses[r.status] = statuses.get(r.status, 0) + 1
    score = sum(passed) / len(passed)
    details = {"passed": sum(passed), "tests": len(passed), "statuses": statuses}
    return GradeResult(score, all(passed), code, details)


def grade_code_batch(
    responses: Sequence[str], ground_truths: Sequence[Any], *, sandbox: Sandbox, timeout_s: float
) -> list[GradeResult]:
    """Grade many answers with one sandbox batch (every test of every answer runs in parallel)."""
    out: list[GradeResult | None] = [None] * len(responses)
    plan: list[tuple[int, str, list[CodeTest]]] = []
    for i, (resp, truth) in enumerate(zip(responses, ground_truths, strict=True)):
        code, why = extract_code(resp)
        if code is None:
            out[i] = _without_code(resp, truth, why)
            continue
        try:
            tests = build_tests(code, parse_tests(truth))
        except (ValueError, TypeError) as e:  # the recipe scores an exception -1; say why, grade the rest
            out[i] = GradeResult(-1.0, False, code, {"error": f"bad code tests: {e}"})
            continue
        plan.append((i, code, tests))
    flat = [t for _, _, tests in plan for t in tests]
    results = sandbox.run_batch(
        [t.program for t in flat], stdins=[t.stdin for t in flat], timeout_s=timeout_s
    )
    k = 0
    for i, code, tests in plan:
        out[i] = _summary(code, tests, results[k : k + len(tests)])
        k += len(tests)
    return [r for r in out if r is not None]


def _without_code(response: str, truth: Any, why: str | None) -> GradeResult:
    """No gradable code: the recipe's boxed-answer fallback for plain ground truths, else -1 with the reason."""
    if why == NO_BLOCK and last_boxed(response) is not None:
        try:
            parse_tests(truth)
        except (ValueError, TypeError):  # not tests (json.JSONDecodeError is a ValueError): a plain answer
            g = grade(response, str(truth))
            return GradeResult(g.score, g.correct, g.pred, {**(g.details or {}), "boxed_fallback": True})
    return GradeResult(-1.0, False, None, {"no_code": why})


def grade_code(response: str, ground_truth: Any, *, sandbox: Sandbox, timeout_s: float = 10.0) -> GradeResult:
    return grade_code_batch([response], [ground_truth], sandbox=sandbox, timeout_s=timeout_s)[0]
