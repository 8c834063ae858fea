"""What every benchmark row shares, whether a benchmark's task writes it (`tirl.tasks.benchmarks`; GSM8K's
`tirl.tasks.gsm8k`) or it comes from the recipe's Hub sets (`tirl.data.hub`): the prompt wording, the row shape,
the answer normalization, and the conversion of the Open-AgentRL LiveCodeBench parquet (the user's copy, read by
the livecodebench task, and the Hub's alike).

Prompt wording: "recipe" (default) is Open-AgentRL's (../docs §3.3-3.4: analyse, use the tool, box the answer);
"plain" is the bare problem plus one line saying where the answer goes. Ground truths are normalized once, where a
row is made: AIME's zero-padded "025" becomes "25", AMC's float 27.0 becomes "27" (`integer_answer`,
`aime_answer`). Code ground truths are JSON strings (as in the LiveCodeBench file) so every row has the same
parquet type.

Deliberately not here: which benchmarks exist and their files (each is a task: `tirl.tasks.benchmarks`).
"""

from __future__ import annotations

import gzip
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

WORDINGS = ("recipe", "plain")
AIME_ANSWER = re.compile(r"\d{1,3}")  # canonical (no sign, no leading zero): 0 to 999

MATH_PROMPT_1 = "Analyze and solve the following math problem step by step. \n\n"
MATH_PROMPT_2 = (
    "\n\nThe tool could be used for more precise and efficient calculation and could help you to verify your "
    "result before you reach the final answer."
)
AGENT_PROMPT = (
    "\n\n**Note: You should first analyze the problem and form a high-level solution strategy, then utilize the "
    "tools to help you solve the problem.**"
)
ANSWER_FORMAT = (
    "\nRemember once you make sure the current answer is your final answer, do not call the tools again and "
    "directly output the final answer in the following text format, the answer format must be: "
    "\\boxed{'The final answer goes here.'}."
)
CODE_NOTE = (
    "\nBefore sumbit your code, you can utilize tools to check the correctness of your code, once you make sure "
    "the current code is correct, do not call the tools again and submit your code within "
    "```python\n# YOUR CODE HERE\n```."
)  # "sumbit" is the recipe's own typo, kept so prompts match its data
CHOICE_NOTE = "\n Here you need to put the final uppercase letter option of this problem into \\boxed{}"
PLAIN_MATH = "\n\nPut your final answer within \\boxed{}."
PLAIN_CODE = "\n\nWrite your solution in a single ```python code block."
PLAIN_CHOICE = "\n\nPut the letter of the correct option within \\boxed{}."


def math_prompt(problem: str, wording: str) -> str:
    if wording == "plain":
        return problem + PLAIN_MATH
    return MATH_PROMPT_1 + problem + MATH_PROMPT_2 + AGENT_PROMPT + ANSWER_FORMAT


def code_prompt(problem: str, wording: str) -> str:
    return problem + (PLAIN_CODE if wording == "plain" else AGENT_PROMPT + CODE_NOTE)


def choice_prompt(problem: str, domain: str, wording: str) -> str:
    if wording == "plain":
        return problem + PLAIN_CHOICE
    head = f"Analyze and solve the following {domain} problem step by step. \n\n"
    return head + problem + MATH_PROMPT_2 + AGENT_PROMPT + ANSWER_FORMAT + CHOICE_NOTE


def benchmark_row(source: str, prompt: str, ability: str, truth: str, info: dict[str, Any]) -> dict[str, Any]:
    return {
        "data_source": source,
        "prompt": [{"role": "user", "content": prompt}],
        "ability": ability,
        "reward_model": {"ground_truth": truth, "style": "rule"},
        "extra_info": info,
    }


def read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def integer_answer(value: Any) -> str:
    """AIME/AMC answers as canonical integers ("025" -> "25", 27.0 -> "27"); other values unchanged."""
    text = str(value).strip()
    try:
        f = float(text)
    except ValueError:
        return text
    return str(int(f)) if f.is_integer() else text


def aime_answer(value: Any) -> str:
    """An AIME answer as its canonical integer (`integer_answer`). AIME answers are integers 0 to 999, so anything
    else (a fraction, an expression, 1e3) raises rather than becomes a ground truth that grades every answer
    wrong."""
    text = integer_answer(value)
    if not AIME_ANSWER.fullmatch(text):
        raise ValueError(f"an AIME answer is an integer from 0 to 999, not {str(value)[:40]!r}")
    return text


def prepare_livecodebench(wording: str, path: str | Path) -> list[dict[str, Any]]:
    """The Open-AgentRL LiveCodeBench eval parquet: JSON-string reward_model/extra_info decoded and validated."""
    from tirl.data.readers import iter_records
    from tirl.data.schema import RowError, SchemaError, validate_rl_row

    rows = []
    for n, rec in iter_records(path):
        if isinstance(rec, RowError):
            raise rec
        if "prompt" not in rec and isinstance(rec.get("problem"), str):
            rec = {**rec, "prompt": [{"role": "user", "content": code_prompt(rec["problem"], wording)}]}
        try:
            row = validate_rl_row(rec)
            truth = row["reward_model"]["ground_truth"]
            try:
                tests = json.loads(truth) if isinstance(truth, str) else truth
            except json.JSONDecodeError as e:
                raise SchemaError(
                    "reward_model.ground_truth",
                    f"expected JSON tests (inputs, outputs), got unparsable JSON ({e.msg})",
                ) from None
            if not isinstance(tests, dict) or "inputs" not in tests or "outputs" not in tests:
                raise SchemaError(
                    "reward_model.ground_truth", "expected a JSON object with inputs and outputs"
                )
        except SchemaError as e:
            raise RowError(str(path), n, e.column, e.message) from None
        row["reward_model"] = {**row["reward_model"], "ground_truth": json.dumps(tests)}
        row["extra_info"] = {"id": f"lcb-{n - 1}", **row["extra_info"]}
        row["ability"] = row["ability"] or "code"
        rows.append({k: row[k] for k in ("data_source", "prompt", "ability", "reward_model", "extra_info")})
    return rows
