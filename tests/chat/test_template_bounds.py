"""A hostile chat template (the model directory's code) ends with a one-line error, not a hang or gigabytes: loops
and calls are charged to a step budget, what a template builds or writes is refused before it passes its size
bounds (`tirl.chat.bounded_jinja`), and what a template raises is printed with its escape sequences written out.
Rendering within the bounds is transformers' own text."""

from __future__ import annotations

import json

import pytest
from family_templates import FAMILIES, with_family_tokens

from conftest import sample_conversation
from hangguard import hang_guard
from tirl.chat.bounded_jinja import render_template
from tirl.chat.hf_template import TemplateFormat
from tirl.chat.template_check import synthetic_conversation
from tirl.chat.tool_formats.hermes import FORMAT as HERMES
from tirl.cli import main
from tirl.tools.code_interpreter import CODE_INTERPRETER_SCHEMA

# ~1-2 s measured for each hostile template below (the step budget spent); the old code ran them for hours
GUARD_S = 30

# a Qwen3-style template: a reverse scan with a namespace, reasoning split out of content, tool calls as JSON
QWEN3_LIKE = (
    "{%- if tools %}{{- '<|im_start|>system\\n# Tools\\n<tools>' }}{%- for tool in tools %}{{- '\\n' }}"
    "{{- tool | tojson }}{%- endfor %}{{- '\\n</tools><|im_end|>\\n' }}{%- endif %}"
    "{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}"
    "{%- for message in messages[::-1] %}{%- set index = (messages|length - 1) - loop.index0 %}"
    "{%- if ns.multi_step_tool and message.role == 'user' and not message.content.startswith('<tool_response>') %}"
    "{%- set ns.multi_step_tool = false %}{%- set ns.last_query_index = index %}{%- endif %}{%- endfor %}"
    "{%- for message in messages %}{%- set content = message.content if message.content is string else '' %}"
    "{%- if message.role == 'assistant' %}{%- set reasoning = message.reasoning_content or '' %}"
    "{%- if '</think>' in content %}{%- set reasoning = content.split('</think>')[0].split('<think>')[-1] %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}{%- endif %}"
    "{%- if loop.index0 > ns.last_query_index %}"
    "{{- '<|im_start|>assistant\\n<think>\\n' + reasoning.strip('\\n') + '\\n</think>\\n\\n' + content }}"
    "{%- else %}{{- '<|im_start|>assistant\\n' + content }}{%- endif %}"
    "{%- for call in message.tool_calls or [] %}{{- '\\n<tool_call>\\n' ~ {'name': call.function.name, "
    "'arguments': call.function.arguments} | tojson(indent=2) ~ '\\n</tool_call>' }}{%- endfor %}"
    "{{- '<|im_end|>\\n' }}{%- else %}{{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}"
)


def _long_conversation(turns: int) -> list[dict]:
    call = {
        "type": "function",
        "function": {"name": "code_interpreter", "arguments": {"code": "print(6 * 7)"}},
    }
    conv = [{"role": "system", "content": "S"}, {"role": "user", "content": "What is 6 * 7?"}]
    for k in range(turns):
        conv += [
            {"role": "assistant", "content": f"<think>\nstep {k}\n</think>\n\nLet me run it.", "tool_calls": [call]},
            {"role": "tool", "content": "42"},
        ]  # fmt: skip
    return conv + [{"role": "assistant", "content": "\\boxed{42}", "reasoning_content": "done"}]


@pytest.mark.parametrize("name", ["tiny", "qwen3-like", *FAMILIES])
def test_a_template_renders_as_transformers_renders_it(tokenizer, name):
    template = {"tiny": tokenizer.chat_template, "qwen3-like": QWEN3_LIKE}.get(name) or FAMILIES[name][0]
    tok = with_family_tokens(tokenizer, template)
    for conv in (sample_conversation(), synthetic_conversation(), _long_conversation(200)):
        for tools, gen, thinking in ((None, False, True), ([CODE_INTERPRETER_SCHEMA], True, False)):
            kw = {"tools": tools, "add_generation_prompt": gen, "enable_thinking": thinking}
            theirs = tok.apply_chat_template(conv, tokenize=False, **kw)
            assert render_template(template, conv, **kw, **tok.special_tokens_map) == theirs


def _refusal(tokenizer, template: str) -> str:
    """The error of the template format built on `template` (its first render is the end-of-turn probe)."""
    with hang_guard(GUARD_S, "the template still renders"), pytest.raises(ValueError) as e:
        TemplateFormat(tokenizer, HERMES, template=template)
    return str(e.value)


NESTED_LOOPS = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"


@pytest.mark.parametrize(
    "template",
    [
        NESTED_LOOPS,
        "{% macro f(n) %}{% if n %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(60) }}",
        "{% for x in range(100000) recursive %}{% if loop.depth < 3 %}{{ loop(range(100000)) }}{% endif %}"
        "{% endfor %}",
        "{% set s = range(100000) | list %}{% for i in range(100000) %}{% set t = s | sort %}{% endfor %}",
    ],
    ids=["nested-loops", "macro-doubling", "recursive-loop", "sort-in-a-loop"],
)
def test_a_template_that_works_without_end_is_refused_when_its_steps_run_out(tokenizer, template):
    assert "more than 2097152 steps" in _refusal(tokenizer, template)


@pytest.mark.parametrize(
    "template, what",
    [
        ('{{ "x" * 33554432 }}', "a repetition of 33554432 characters"),
        ('{% set n = 33554432 %}{{ "x" * n }}', "a repetition of 33554432 characters"),
        ('{% set a = "a" * 10000 %}{{ a.replace("a", a) }}', "a string of 100000000 characters"),
        ('{% set a = "a" * 10000 %}{{ a | replace("a", a) }}', "a string of 100000000 characters"),
        ('{{ "x" | center(30000000) }}', "passes 30000000 to a filter"),
        ('{% set n = 30000000 %}{{ "x".ljust(n) }}', "passes 30000000 to a filter or string method"),
        ('{{ "%30000000d" % 1 }}', "a formatted string of 30000012 characters"),
        ('{{ "{:>30000000}".format(1) }}', "a formatted string of"),
        ("{{ 3 ** 1000000 }}", "a power of 2000000 bits"),
        (
            "{% set ns = namespace(x=[1]) %}{% for i in range(23) %}{% set ns.x = [ns.x, ns.x] %}{% endfor %}"
            "{{ ns.x }}",
            "text of",
        ),  # fmt: skip
        (
            '{% set a = "x" * 1000000 %}{% for i in range(30) %}{{ a }}{% endfor %}',
            "text of 17000000 characters",
        ),
    ],
    ids=[
        "repeat",
        "repeat-var",
        "replace",
        "replace-filter",
        "center",
        "ljust",
        "percent",
        "format",
        "power",
        "shared-list",
        "output",
    ],  # fmt: skip
)
def test_a_template_that_builds_past_the_size_bounds_is_refused_before_it_builds_it(
    tokenizer, template, what
):
    assert what in _refusal(tokenizer, template)


def test_check_tokens_ends_a_template_that_loops_without_end_with_one_line(tokenizer, tmp_path, capsys):
    model = tmp_path / "tok"
    with_family_tokens(tokenizer, NESTED_LOOPS).save_pretrained(model)
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"messages": sample_conversation()}) + "\n")
    with hang_guard(GUARD_S, "the template still renders"):
        assert main(["check-tokens", str(rows), "--model", str(model), "--format", "template"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "more than 2097152 steps" in err


def test_what_a_template_raises_is_printed_with_its_escape_sequences_written_out(tokenizer):
    message = _refusal(tokenizer, "{{ raise_exception('\\x1b[2J\\x1b[31mcleared\\nand red\\u202e') }}")
    assert "\x1b" not in message and "\n" not in message and "\u202e" not in message
    assert "(TemplateError: \\x1b[2J\\x1b[31mcleared\\nand red\\u202e)" in message
