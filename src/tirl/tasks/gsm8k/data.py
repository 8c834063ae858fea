"""GSM8K's packaged splits (`files/`, provenance in files/SOURCE.md): the raw records, their ids, the gold answer
after "####", and the rows `tirl data prepare gsm8k [--split train]` writes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tirl.data.benchmarks import benchmark_row, math_prompt, read_jsonl

FILES = Path(__file__).parent / "files"
SPLITS = ("test", "train")
DATA_SOURCES = ("gsm8k", "openai/gsm8k")  # the rows the gsm8k verifier grades (the Hub's name too)


def gsm8k_records(split: str = "test") -> list[dict[str, Any]]:
    """GSM8K's raw rows (question, answer with its calculator annotations) of `split`, in file order."""
    if split not in SPLITS:
        raise ValueError(f"unknown gsm8k split {split!r}; valid: {', '.join(SPLITS)}")
    return list(read_jsonl(FILES / f"{split}.jsonl"))


def gsm8k_id(split: str, i: int) -> str:
    """Row i's id: the test split keeps its earlier ids (gsm8k-{i}), the train split's are gsm8k-train-{i}."""
    return f"gsm8k-{i}" if split == "test" else f"gsm8k-{split}-{i}"


def gsm8k_answer(solution: str) -> str:
    """The gold number after GSM8K's final '####', thousands separators removed."""
    if "####" not in solution:
        raise ValueError(f"GSM8K answer has no '####' line: {solution[-80:]!r}")
    return solution.rsplit("####", 1)[1].strip().replace(",", "")


def prepare_gsm8k(wording: str, split: str = "test") -> list[dict[str, Any]]:
    """Every problem of `split` as an RL-schema row in `wording` (`tirl data prepare gsm8k`)."""
    return [
        benchmark_row(
            "gsm8k",
            math_prompt(r["question"], wording),
            "math",
            gsm8k_answer(r["answer"]),
            {"id": gsm8k_id(split, i)},
        )
        for i, r in enumerate(gsm8k_records(split))
    ]
