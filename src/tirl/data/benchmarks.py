"""The evaluation benchmarks as RL-schema rows: packaged ones (aime24, aime25, amc23, math500, humaneval; GSM8K is
packaged with its task, `tirl.tasks.gsm8k`)
and user-supplied ones (gpqa from GPQA's published CSV, livecodebench from the Open-AgentRL eval parquet).

Prompt wording: "recipe" (default) is Open-AgentRL's (../docs §3.3-3.4: analyse, use the tool, box the answer);
"plain" is the bare problem plus one line saying where the answer goes. Ground truths are normalized here, once:
AIME's zero-padded "025" becomes "25", AMC's float 27.0 becomes "27".
Code ground truths are JSON strings (as in the LiveCodeBench file) so every row has the same parquet type.
Provenance and licenses of the packaged files: files/SOURCE.md.
"""

from __future__ import annotations

import csv
import gzip
import json
import random
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

FILES = Path(__file__).parent / "files"
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


def _aime(source: str, files: list[str], wording: str) -> list[dict[str, Any]]:
    """AIME's or AMC's packaged rows (AMC's answers are not all 0 to 999: only AIME's are checked)."""
    answer = aime_answer if source.startswith("aime") else integer_answer
    rows = []
    for name in files:
        for i, r in enumerate(read_jsonl(FILES / name)):
            info = {"id": f"{source}-{r.get('id', i)}", "raw_answer": str(r["answer"])}
            try:
                truth = answer(r["answer"])
            except ValueError as e:
                raise ValueError(f"{FILES / name}: row {i + 1}: {e}") from None
            rows.append(benchmark_row(source, math_prompt(r["problem"], wording), "math", truth, info))
    return rows


def prepare_aime24(wording: str) -> list[dict[str, Any]]:
    return _aime("aime24", ["aime24/test.jsonl"], wording)


def prepare_aime25(wording: str) -> list[dict[str, Any]]:
    return _aime("aime25", ["aime25/test2025-I.jsonl", "aime25/test2025-II.jsonl"], wording)


def prepare_amc23(wording: str) -> list[dict[str, Any]]:
    return _aime("amc23", ["amc23/test.jsonl"], wording)


def prepare_math500(wording: str) -> list[dict[str, Any]]:
    return [
        benchmark_row(
            "math500",
            math_prompt(r["problem"], wording),
            "math",
            r["answer"],
            {"id": r["unique_id"], "subject": r["subject"], "level": r["level"], "solution": r["solution"]},
        )
        for r in read_jsonl(FILES / "math500/test.jsonl")
    ]


def prepare_humaneval(wording: str) -> list[dict[str, Any]]:
    rows = []
    for r in read_jsonl(FILES / "humaneval/HumanEval.jsonl.gz"):
        problem = f"Complete the following Python function.\n\n```python\n{r['prompt']}```"
        truth = {"prompt": r["prompt"], "test": r["test"], "entry_point": r["entry_point"]}
        info = {"id": r["task_id"], "canonical_solution": r["canonical_solution"]}
        rows.append(
            benchmark_row("humaneval", code_prompt(problem, wording), "code", json.dumps(truth), info)
        )
    return rows


GPQA_COLUMNS = (
    "Question",
    "Correct Answer",
    "Incorrect Answer 1",
    "Incorrect Answer 2",
    "Incorrect Answer 3",
)


def prepare_gpqa(wording: str, path: str | Path, *, seed: int = 0) -> list[dict[str, Any]]:
    """GPQA's published CSV (gpqa_diamond.csv); options shuffled per row with a seeded RNG, letters A-D."""
    p = Path(path)
    with open(p, encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in GPQA_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"{p}: not GPQA's CSV, missing column(s) {missing}")
        rows = []
        for n, r in enumerate(reader, 1):
            options = [(r[c] or "").strip() for c in GPQA_COLUMNS[1:]]  # a short row leaves None
            if not (r["Question"] or "").strip() or not all(options):
                raise ValueError(f"{p}: row {n}: empty question or option")
            order = list(range(4))
            random.Random(f"{seed}:{r.get('Record ID', n)}").shuffle(order)
            letters = "ABCD"
            body = "\n".join(f"{letters[k]}) {options[j]}" for k, j in enumerate(order))
            problem = f"{r['Question'].strip()}\n\n{body}"
            domain = (r.get("High-level domain") or "science").strip()
            info = {"id": r.get("Record ID") or f"gpqa-{n}", "domain": domain}
            rows.append(
                benchmark_row(
                    "gpqa_diamond",
                    choice_prompt(problem, domain, wording),
                    domain,
                    letters[order.index(0)],
                    info,
                )
            )
    return rows


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


PACKAGED: dict[str, Callable[[str], list[dict[str, Any]]]] = {
    "aime24": prepare_aime24,
    "aime25": prepare_aime25,
    "amc23": prepare_amc23,
    "math500": prepare_math500,
    "humaneval": prepare_humaneval,
}
USER_SUPPLIED: dict[str, Callable[..., list[dict[str, Any]]]] = {
    "gpqa": prepare_gpqa,
    "livecodebench": prepare_livecodebench,
}
NAMES = (*PACKAGED, *USER_SUPPLIED)


def prepare(name: str, *, wording: str = "recipe", source: str | Path | None = None) -> list[dict[str, Any]]:
    """Rows of benchmark `name` (its one evaluation split); gpqa and livecodebench need `source`, the user's copy
    of the published file."""
    if wording not in WORDINGS:
        raise ValueError(f"unknown wording {wording!r}; valid: {', '.join(WORDINGS)}")
    if name in PACKAGED:
        if source is not None:
            raise ValueError(f"{name} is packaged with tirl; --source is only for {', '.join(USER_SUPPLIED)}")
        return PACKAGED[name](wording)
    if name in USER_SUPPLIED:
        if source is None:
            hub = {"gpqa": "open-agentrl-gpqa", "livecodebench": "open-agentrl-lcb-v6"}[name]
            raise ValueError(
                f"{name} is not packaged (license): pass --source FILE, the published file, or prepare {hub}, "
                "the recipe's copy fetched from the Hugging Face Hub"
            )
        if not Path(source).is_file():
            raise FileNotFoundError(f"source file {str(source)!r} does not exist")
        return USER_SUPPLIED[name](wording, source)
    raise ValueError(f"unknown benchmark {name!r}; valid: {', '.join(NAMES)}")
