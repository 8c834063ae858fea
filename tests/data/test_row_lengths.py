"""A row with more characters than its token limit can hold is refused by its length, naming the row, before any
tokenizer sees it (`tirl.data.lengths`): in `tirl sft`, `tirl data inspect`, RL's prompt filter and the evaluator's
prompt check."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import tirl.commands.data as data_cmd
from tirl.data.lengths import MAX_CHARS_PER_TOKEN, check_row_chars, text_chars
from tirl.data.records import ProblemRow
from tirl.rollout.agent.episodes import check_prompt_lengths
from tirl.train.rl.batch import fitting_prompts
from tirl.train.sft import render_rows

HUGE = 4 * 2**20  # characters: a few MB, far past 1024 tokens' worth


class CountingRenderer:
    """A renderer that records what it was asked to tokenize (and tokenizes nothing)."""

    def __init__(self) -> None:
        self.seen: list[int] = []  # characters of each conversation it was asked to tokenize

    def samples(
        self, messages: list[dict[str, Any]], *, tools: Any = None
    ) -> list[tuple[list[int], list[int]]]:
        self.seen.append(text_chars(messages))
        return [([1, 2, 3], [0, 1, 1])]

    def encode(self, text: str) -> list[int]:
        self.seen.append(len(text))
        return [1]

    def prompt_ids(self, messages: list[dict[str, Any]]) -> list[int]:
        self.seen.append(text_chars(messages))
        return [1, 2, 3]


def chat(content: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": content}]}


def test_a_huge_sft_row_is_refused_naming_it_before_it_is_tokenized() -> None:
    renderer = CountingRenderer()
    with pytest.raises(ValueError) as exc:
        render_rows([chat("ok"), chat("x" * HUGE)], renderer, max_length=1024, source="sft.jsonl")
    assert str(exc.value).startswith(
        "sft.jsonl: row 2: more than 32768 characters, which sft.max_length=1024 tokens cannot hold"
    )
    assert max(renderer.seen) < 100  # row 1 only: the huge row never reached the tokenizer


def test_a_huge_prompt_completion_row_is_refused_before_it_is_tokenized() -> None:
    renderer = CountingRenderer()
    with pytest.raises(ValueError, match="row 1: more than 32768 characters"):
        render_rows([{"prompt": "q", "completion": "y" * HUGE}], renderer, max_length=1024)
    assert renderer.seen == []


def test_the_bound_is_the_token_limit_times_the_characters_a_token_may_cover() -> None:
    check_row_chars(
        {"content": "x" * (64 * MAX_CHARS_PER_TOKEN - len("content"))}, 64, where="row 1", key="k"
    )
    with pytest.raises(ValueError, match="row 1: more than 2048 characters, which k=64 tokens cannot hold"):
        check_row_chars({"content": "x" * (64 * MAX_CHARS_PER_TOKEN)}, 64, where="row 1", key="k")


def test_a_row_within_the_bound_is_tokenized() -> None:
    renderer = CountingRenderer()
    render_rows([chat("x" * 1000)], renderer, max_length=64)
    assert renderer.seen == [text_chars(chat("x" * 1000)["messages"])]


def test_inspect_refuses_a_huge_example_row_by_its_length_without_tokenizing(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    def no_renderer(*args: Any) -> Any:
        raise AssertionError("a tokenizer was built for the huge row")

    monkeypatch.setattr(data_cmd, "build_inspect_renderer", no_renderer)
    path = tmp_path / "sft.jsonl"
    path.write_text(json.dumps(chat("x" * HUGE)) + "\n", encoding="utf-8")
    assert data_cmd.inspect_command(str(path), max_length=1024) == 1
    out = capsys.readouterr().out
    assert "example row 1: more than 32768 characters, which --max-length=1024 tokens cannot hold" in out


def test_rl_prompts_too_long_by_their_characters_are_dropped_untokenized() -> None:
    renderer = CountingRenderer()
    short = ProblemRow("1", "math", [{"role": "user", "content": "2+2?"}], "4")
    huge = ProblemRow("2", "math", [{"role": "user", "content": "z" * HUGE}], "4")
    assert fitting_prompts([short, huge], renderer, max_tokens=16) == [short]
    assert renderer.seen == [text_chars(short.prompt)]


def test_an_eval_prompt_longer_than_the_model_positions_is_refused_untokenized() -> None:
    renderer = CountingRenderer()
    agent = SimpleNamespace(renderer=renderer, config=SimpleNamespace(max_response_tokens=16))
    huge = ProblemRow("p7", "aime", [{"role": "user", "content": "z" * HUGE}], "4")
    said = "eval row 1 (aime problem p7) has a prompt of more than 32768 characters (not tokenized"
    with pytest.raises(ValueError, match=re.escape(said)):
        check_prompt_lengths([huge], agent, 1024)
    assert renderer.seen == []


def test_characters_are_counted_through_any_nesting_without_recursion() -> None:
    deep: Any = "abc"
    for _ in range(100_000):  # far past Python's recursion limit
        deep = [deep]
    assert text_chars({"k": deep}) == len("k") + 3


def test_counting_stops_once_past_the_bound() -> None:
    assert text_chars(["a" * 10, "b" * 10, "c" * 10], stop_after=5) <= 20


def test_check_tokens_refuses_a_huge_row_before_rendering_it(tmp_path: Path) -> None:
    from tirl.commands.tokcheck import _jsonl_rows

    path = tmp_path / "sft.jsonl"
    path.write_text(json.dumps(chat("ok")) + "\n" + json.dumps(chat("x" * HUGE)) + "\n")
    rows = _jsonl_rows(path, 1024)
    assert next(rows)[0] == 1  # the short row passes
    with pytest.raises(
        ValueError, match=r"sft.jsonl: row 2: more than 32768 characters, which --max-length=1024"
    ):
        next(rows)
