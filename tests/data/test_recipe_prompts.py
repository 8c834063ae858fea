"""rl.prompt_rewrite=verl: CustomRLHFDataset's rewrites, branch picked by the file's first row's data_source."""

import pytest

from tirl.data.benchmarks import AGENT_PROMPT, ANSWER_FORMAT, CODE_NOTE, MATH_PROMPT_1, MATH_PROMPT_2
from tirl.data.recipe_prompts import UNITS_NOTE, UNITS_NOTE_SKYWORK, rewrite_prompts


def _row(source: str, text: str) -> dict:
    return {
        "data_source": source,
        "prompt": [{"role": "user", "content": text}],
        "reward_model": {"ground_truth": "1"},
    }


def test_math_dapo_file_gets_the_units_note_on_every_row():
    rows = [_row("math_dapo", "What is 1?"), _row("skywork_code", "Write f.")]
    out = rewrite_prompts(rows)
    assert out[0]["prompt"][0]["content"] == "What is 1?" + UNITS_NOTE
    assert out[1]["prompt"][0]["content"] == "Write f." + UNITS_NOTE  # the first row picked the branch


def test_mega_science_takes_the_same_branch():
    assert rewrite_prompts([_row("mega-science", "Q")])[0]["prompt"][0]["content"] == "Q" + UNITS_NOTE


def test_other_files_wrap_math_and_note_code_row_by_row():
    rows = [_row("skywork_math", "Q1"), _row("skywork_code", "Q2"), _row("Skywork_Code", "Q3")]
    texts = [r["prompt"][0]["content"] for r in rewrite_prompts(rows)]

    def wrapped(q: str) -> str:
        return MATH_PROMPT_1 + q + MATH_PROMPT_2 + AGENT_PROMPT + ANSWER_FORMAT + UNITS_NOTE_SKYWORK

    assert texts[0] == wrapped("Q1")
    assert texts[1] == "Q2" + AGENT_PROMPT + CODE_NOTE
    assert texts[2] == wrapped("Q3")  # "code" is matched case-sensitively, as the recipe does


def test_prepared_benchmarks_and_the_input_are_left_alone():
    rows = [_row("AIME2024", "Q")]
    assert rewrite_prompts(rows) == rows
    original = [_row("math_dapo", "Q")]
    rewrite_prompts(original)
    assert original[0]["prompt"][0]["content"] == "Q"  # copies are rewritten, never the caller's rows


def test_a_prompt_without_text_names_the_row():
    with pytest.raises(ValueError, match="rl.data row 1"):
        rewrite_prompts([_row("math_dapo", "Q"), {"data_source": "math_dapo", "prompt": []}])
