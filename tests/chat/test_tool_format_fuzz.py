"""Every tool-call parser against random and adversarial text: it never raises, whatever the text holds (nesting,
huge numbers, unclosed tags, control characters, unpaired surrogates); a call it accepts can be carried through a
run (its name and arguments encode as UTF-8 JSON); an error it returns can be sent back to the model; and a
recipe-length turn of any adversarial pattern parses in time linear in its length."""

import json
import multiprocessing
import random
import time

import pytest

from tirl.chat.tool_formats import TOOL_FORMATS, ToolCall
from tirl.chat.tool_formats.base import MAX_DEPTH
from tirl.chat.tool_formats.json_calls import HEADER

SCHEMAS = [
    {
        "type": "function",
        "function": {
            "name": "run",
            "parameters": {
                "type": "object",
                "properties": {
                    "code": {"type": "string"},
                    "timeout": {"type": "integer"},
                    "options": {"type": "object"},
                },
            },
        },
    }
]

FRAGMENTS = [
    "<tool_call>", "</tool_call>", "<function=", "<function=run>", "</function>", "<parameter=", "<parameter=code>",
    "<parameter=timeout>", "</parameter>", HEADER, "<", ">", "=", "{", "}", "[", "]", '"', ":", ",", "\\", "\\u",
    "\\ud800", "\\udc00", '"name"', '"arguments"', '"parameters"', '"run"', '"code"', "1", "-", "e", ".", "0",
    "true", "null", "NaN", "Infinity", " ", "\n", "\t", "\r", "\x00", "\x1b[31m", "\x7f", "\u2028", "\x85",
    "\ud800", "\udfff", "é", "数", "\U0001f600", "7" * 5000, "[" * 2000, '{"a":' * 1200, "<|im_end|>",
]  # fmt: skip

DEEP = "[" * (MAX_DEPTH + 10) + "]" * (MAX_DEPTH + 10)  # parses as JSON, deeper than a call may carry
ADVERSARIAL_VALUES = {  # an argument's JSON text
    "huge_integer": "7" * 5000,
    "nesting_past_the_recursion_limit": "[" * 1000 + "]" * 1000,
    "unclosed_nesting": "[" * 100_000,
    "deep_nesting": DEEP,
    "unpaired_surrogate_escape": '"\\ud800"',
    "unpaired_surrogate": '"\ud800"',
    "control_characters": '"\x00\x1b[2J\x7f"',  # strict JSON refuses them; XML carries them as text
}
ACCEPTED = {"control_characters"}  # may parse (as XML text); every other case must be an error call
TEXT_CASES = {"unpaired_surrogate_escape", "unpaired_surrogate", "control_characters"}  # a string argument


def call_with(name: str, key: str, value: str) -> str:
    """A call of tool `run` whose argument `key` is the raw text `value`, as format `name` writes it."""
    if name == "qwen3_xml":
        return f"<tool_call>\n<function=run>\n<parameter={key}>\n{value}\n</parameter>\n</function>\n</tool_call>"
    if name == "json":
        return f'{HEADER}{{"name": "run", "parameters": {{"{key}": {value}}}}}'
    return f'<tool_call>\n{{"name": "run", "arguments": {{"{key}": {value}}}}}\n</tool_call>'


def assert_carried(calls: list[ToolCall]) -> None:
    """Each call either fits a run (UTF-8 JSON name and arguments) or has an error text the model can be sent."""
    assert isinstance(calls, list)
    for c in calls:
        if c.error is None:
            assert isinstance(c.name, str) and isinstance(c.arguments, dict)
            json.dumps([c.name, c.arguments], ensure_ascii=False).encode("utf-8")
        else:
            assert isinstance(c.error, str) and c.error.startswith("Error:")
            c.error.encode("utf-8")


def mutate(text: str, rng: random.Random) -> str:
    """`text` with a few fragments inserted, characters deleted or spans duplicated."""
    for _ in range(rng.randint(1, 4)):
        at = rng.randint(0, len(text))
        op = rng.random()
        if op < 0.5:
            text = text[:at] + rng.choice(FRAGMENTS) + text[at:]
        elif op < 0.8:
            text = text[:at] + text[at + rng.randint(1, 8) :]
        else:
            text = text[:at] + text[at : at + rng.randint(1, 40)] * rng.randint(2, 5) + text[at:]
    return text


@pytest.mark.parametrize("name", list(TOOL_FORMATS))
def test_random_text_never_raises(name):
    rng = random.Random(f"fuzz-{name}")
    fmt = TOOL_FORMATS[name]
    for _ in range(300):
        text = "".join(rng.choices(FRAGMENTS, k=rng.randint(0, 40)))
        assert_carried(fmt.parse(text, SCHEMAS))
        assert_carried(fmt.parse(fmt.start + text, SCHEMAS, limit=2))


@pytest.mark.parametrize("name", list(TOOL_FORMATS))
def test_mutated_calls_never_raise(name):
    rng = random.Random(f"mutate-{name}")
    fmt = TOOL_FORMATS[name]
    calls = [
        fmt.render("run", {"code": "print(6 * 7)", "timeout": 3}),
        fmt.render("run", {"options": {"a": [1, {"b": None}]}, "code": "x = '<tag>'"}),
    ]
    for _ in range(400):
        text = "Let me run it." + fmt.separator + fmt.separator.join(rng.sample(calls, rng.randint(1, 2)))
        assert_carried(fmt.parse(mutate(text, rng), SCHEMAS))


@pytest.mark.parametrize("name", list(TOOL_FORMATS))
@pytest.mark.parametrize("case", list(ADVERSARIAL_VALUES))
def test_an_adversarial_argument_is_an_error_sent_back(name, case):
    key, value = ("code" if case in TEXT_CASES else "timeout"), ADVERSARIAL_VALUES[case]
    if name == "qwen3_xml" and key == "code":
        value = json.loads(value, strict=False)  # XML carries a string's characters as they are
    calls = TOOL_FORMATS[name].parse(call_with(name, key, value), SCHEMAS)
    assert_carried(calls)
    assert len(calls) == 1
    assert calls[0].error is not None or case in ACCEPTED


def test_the_issues_reproduction_is_an_error_text():
    text = '<tool_call>{"name":"code_interpreter","arguments":{"code":' + "7" * 5000 + "}}</tool_call>"
    [call] = TOOL_FORMATS["hermes"].parse(text)
    assert call.error is not None and "4300 digits" in call.error


def test_hermes_arguments_sent_as_a_string_may_hold_anything():
    for inner in ("7" * 5000, "[" * 5000, '{"code": "\\ud800"}'):
        text = "<tool_call>" + json.dumps({"name": "run", "arguments": inner}) + "</tool_call>"
        [call] = TOOL_FORMATS["hermes"].parse(text, SCHEMAS)
        assert call.error is not None, inner[:20]


# a recipe turn is at most 20,480 tokens (agent.max_tokens_per_turn of the recipe configs); each pattern below is
# one or a few tokens, repeated that many times (a Qwen token holds up to dozens of spaces: 64 per unit here)
TURN_TOKENS = 20_480
PATTERNS = {
    "hermes": ["<tool_call>", "<tool_call></tool_call>", '<tool_call>{"a":', "<tool_call>[", " " * 64,
               '<tool_call>"\\ud800"</tool_call>'],
    "qwen3_xml": ["<tool_call>", " " * 64, "<parameter=a>x", "<parameter=", "<function=run>",
                  "<tool_call><function=run></function></tool_call>", "<parameter=a>\n1\n</parameter>"],
    "json": [HEADER, HEADER + " ", HEADER + "{", HEADER + '{"', HEADER + '["', HEADER + '{"a":"', HEADER + "[",
             HEADER + '["\\"', '"' + HEADER, HEADER + '\\"'],
}  # fmt: skip
# the slowest pattern took 0.7 s on a loaded 2-core machine; a quadratic parser took 21.6 s (hermes, 20,480 unclosed
# tags) and 10.7 s (qwen3_xml, 80k spaces) at this length: the bound catches that with a tenfold margin, and the
# parse runs in a child killed at the bound, so a regression fails the test instead of hanging it
BOUND_S = 10.0


def adversarial_turn(name: str, unit: str) -> str:
    body = unit * TURN_TOKENS
    if name == "qwen3_xml" and not unit.startswith("<tool_call>"):
        return "<tool_call><function=run>" + body + "</function></tool_call>"
    if name == "hermes" and not unit.startswith("<tool_call>"):
        return "<tool_call>" + body + "</tool_call>"
    return body if unit.startswith(HEADER) or name != "json" else HEADER + body


def _parse_and_check(name: str, unit: str) -> None:
    assert_carried(TOOL_FORMATS[name].parse(adversarial_turn(name, unit), SCHEMAS))


@pytest.mark.parametrize(
    ("name", "unit"), [(n, u) for n, units in PATTERNS.items() for u in units], ids=lambda x: repr(x)[:24]
)
def test_a_recipe_length_adversarial_turn_parses_in_bounded_time(name, unit):
    child = multiprocessing.get_context("fork").Process(target=_parse_and_check, args=(name, unit))
    start = time.perf_counter()
    child.start()
    child.join(BOUND_S)
    took = time.perf_counter() - start
    if child.is_alive():
        child.kill()
        child.join()
    assert took < BOUND_S, (
        f"{name} took over {BOUND_S:g} s on {len(adversarial_turn(name, unit))} chars of {unit!r}"
    )
    assert child.exitcode == 0
