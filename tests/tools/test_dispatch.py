"""The agent dispatches calls by name to a task's tools: errors for unknown tools and bad arguments, several calls
per turn (capped), function tools run concurrently, and the tool-call reward counts executed calls as before."""

import threading
import time

from tirl.chat.tokcheck import check_rows
from tirl.chat.tool_formats.hermes import call_json, parse_tool_calls
from tirl.rewards.shaping import tool_call_term
from tirl.rollout.agent.loop import AgentConfig, AgentLoop, stop_token_ids
from tirl.rollout.engines.base import RemoteModel
from tirl.rollout.sampling import SamplingParams
from tirl.rollout.types import Generation
from tirl.tools import CodeInterpreter, ToolSet, tool


class ScriptedEngine(RemoteModel):
    """Returns each prompt's next scripted turn, ending it with <|im_end|>."""

    def __init__(self, renderer, turns):
        self.renderer, self.turns = renderer, turns

    def generate(self, prompts, params, *, max_new_tokens=None, generator=None):
        out = []
        for k in range(len(prompts)):
            ids = self.renderer.encode(self.turns[k].pop(0)) + [self.renderer.eos_id]
            out.append(Generation(ids, [-0.5] * len(ids), "eos"))
        return out


def call(name, **arguments):
    return f"<tool_call>\n{call_json(name, arguments)}\n</tool_call>"


@tool(sandbox=False)
def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first.
        b: The second.
    """
    return a + b


@tool(sandbox=False)
def divide(a: float, b: float) -> float:
    """Divide a by b.

    Args:
        a: The numerator.
        b: The denominator.
    """
    return a / b


def run(renderer, sandbox, turns, tools, **cfg):
    cfg = {"max_response_tokens": 4096, "max_tokens_per_turn": 1024, **cfg}
    prompts = [[{"role": "user", "content": "q"}]]
    loop = AgentLoop(
        ScriptedEngine(renderer, [list(turns)]), renderer, sandbox, AgentConfig(**cfg), tools=tools
    )
    return loop.run(prompts, SamplingParams())[0]


def test_calls_are_dispatched_by_name_and_bad_ones_get_an_error_text(renderer, sandbox):
    tools = ToolSet([CodeInterpreter(), add, divide])
    turns = [
        call("add", a=2, b=3),
        call("code_interpreter", code="print(6 * 7)"),
        call("search", query="x"),
        call("add", a=2, c=3),
        call("add", a="2", b=3),
        call("divide", a=1, b=0),
        "<tool_call>{not json}</tool_call>",
        "\\boxed{5}",
    ]
    t = run(renderer, sandbox, turns, tools)
    got = [(c.name, c.status, c.response) for c in t.tool_calls]
    assert got == [
        ("add", "ok", "5"),
        ("code_interpreter", "ok", "42\n"),
        ("search", "parse_error", "Error: unknown tool 'search'; available: code_interpreter, add, divide."),
        ("add", "parse_error", "Error: bad arguments for tool 'add': unknown argument 'c' (valid: a, b); "
                               "missing required argument 'b'."),
        ("add", "parse_error", "Error: bad arguments for tool 'add': argument 'a' must be integer, got string '2'."),
        ("divide", "tool_error", "Error: ZeroDivisionError: division by zero"),
        (None, "parse_error", "Error: the tool call is not valid JSON (Expecting property name enclosed in double "
                              "quotes at char 1)."),
    ]  # fmt: skip
    assert t.stop_reason == "answer" and t.turns == 8
    # the tool-call reward counts executed calls only (parse errors earn nothing), as before: 3 ran
    assert t.num_executed_calls == 3
    assert tool_call_term(-1.0, t.num_executed_calls) == -1.0 + 0.1 * 3


def test_several_calls_in_one_turn_run_and_answer_in_one_tool_turn(renderer, sandbox):
    tools = ToolSet([CodeInterpreter(), add])
    turn = "\n".join(
        [call("add", a=1, b=2), call("code_interpreter", code="print(10)"), call("add", a=5, b=5)]
    )
    t = run(renderer, sandbox, [turn, "\\boxed{3}"], tools, max_calls_per_turn=2)
    assert [(c.turn, c.name, c.response) for c in t.tool_calls] == [
        (1, "add", "3"),
        (1, "code_interpreter", "10\n"),
    ]
    # the third call is over the cap and ignored; both results come back in one user turn, in call order
    tool_ids = [i for i, m in zip(t.response_ids, t.loss_mask, strict=True) if not m]
    assert tool_ids == renderer.tool_response_ids(["3", "10\n"], assistant_closed=True)
    # tirl check-tokens re-renders the whole trajectory from the prompt messages its meta stores
    row = {**t.to_dict(), "meta": {"prompt": [{"role": "user", "content": "q"}]}}
    assert check_rows(renderer, iter([(1, row)])).divergences == []
    one = run(renderer, sandbox, [turn, "\\boxed{3}"], tools)  # the recipe's default: only the first call
    assert [c.name for c in one.tool_calls] == ["add"]


def test_turns_stop_at_tool_call_end_only_with_one_call_per_turn(renderer):
    assert stop_token_ids(renderer, AgentConfig()) == [renderer.tool_call_end_id]
    assert stop_token_ids(renderer, AgentConfig(max_calls_per_turn=3)) == []


def test_function_tools_run_concurrently_unless_declared_otherwise():
    running, peak, lock = [0], [0], threading.Lock()
    together = [threading.Barrier(4, timeout=60)]  # the four calls meet only if they run at once (load-proof)

    def slow(x: int) -> int:
        """Wait for the others, or a little.

        Args:
            x: Returned as is.
        """
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        together[0].wait() if together[0] else time.sleep(0.05)
        with lock:
            running[0] -= 1
        return x

    calls = parse_tool_calls("".join(call("slow", x=i) for i in range(4)))
    out = ToolSet([tool(slow, sandbox=False)]).execute(calls, None)
    together[0] = None
    assert [o.text for o in out] == ["0", "1", "2", "3"] and peak[0] == 4
    peak[0] = 0
    ToolSet([tool(slow, sandbox=False, concurrent=False)]).execute(calls, None)
    assert peak[0] == 1


def test_a_hanging_tool_answers_a_timeout():
    def hang(x: int) -> int:
        """Sleep.

        Args:
            x: Ignored.
        """
        time.sleep(1.0)
        return x

    out = ToolSet([tool(hang, sandbox=False, timeout_s=0.05)]).execute(
        parse_tool_calls(call("hang", x=1)), None
    )
    assert (out[0].status, out[0].text) == ("timeout", "Error: hang took longer than 0.05 s.")
