"""A tool registered by name is found wherever a recorded call is read back: the trajectory record keeps what the
tool records of a call, the viewer shows the call the tool's own way. The code interpreter is registered like any
other tool, in its own module; a tool defined here (outside tirl) needs no other file."""

from collections.abc import Sequence
from typing import Any

import pytest

from tirl.chat.tool_formats.hermes import call_json
from tirl.eval.viewer import _shown
from tirl.rollout.agent.loop import AgentConfig, AgentLoop
from tirl.rollout.engines.base import RemoteModel
from tirl.rollout.sampling import SamplingParams
from tirl.rollout.types import Generation, Trajectory
from tirl.tools import (
    CodeInterpreter,
    Tool,
    ToolOutput,
    ToolSet,
    recorded_code,
    register_tool,
    registered_tool,
    registry,
    show_call,
    tool,
)

TABLE = {"SELECT answer": "42"}


class Query(Tool):
    """A user's tool: an SQL query over a fixed table, shown in the viewer as its SQL and recorded as its code."""

    def __init__(self) -> None:
        self.name = "query"
        self.schema = {
            "type": "function",
            "function": {
                "name": "query",
                "description": "Run an SQL query.",
                "parameters": {
                    "type": "object",
                    "properties": {"sql": {"type": "string", "description": "The query."}},
                    "required": ["sql"],
                },
            },
        }
        self.sandbox = False

    def show(self, arguments: dict[str, Any] | None) -> str | None:
        return f"-- query\n{(arguments or {}).get('sql')}"

    def recorded_code(self, arguments: dict[str, Any] | None) -> str | None:
        return (arguments or {}).get("sql")

    def run_batch(self, arguments: Sequence[dict[str, Any]], sandbox: Any) -> list[ToolOutput]:
        return [ToolOutput(TABLE.get(a["sql"], "no rows"), "ok") for a in arguments]


@tool(sandbox=False)
def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first.
        b: The second.
    """
    return a + b


@pytest.fixture()
def query(monkeypatch: pytest.MonkeyPatch) -> Query:
    """`Query` registered for this test only."""
    monkeypatch.setattr(registry, "_TOOLS", dict(registry._TOOLS))
    return register_tool(Query())  # type: ignore[return-value]


class ScriptedEngine(RemoteModel):
    def __init__(self, renderer, turns):
        self.renderer, self.turns = renderer, turns

    def generate(self, prompts, params, *, max_new_tokens=None, generator=None):
        ids = self.renderer.encode(self.turns.pop(0)) + [self.renderer.eos_id]
        return [Generation(ids, [-0.5] * len(ids), "eos")]


def call(name: str, **arguments: Any) -> str:
    return f"<tool_call>\n{call_json(name, arguments)}\n</tool_call>"


def test_a_registered_tool_shows_in_the_viewer_its_own_way(query):
    record = {"turn": 1, "code": "SELECT answer", "name": "query", "arguments": {"sql": "SELECT answer"}}
    assert _shown(record) == "-- query\nSELECT answer"
    assert show_call("query", {"sql": "SELECT 1"}) == "-- query\nSELECT 1"
    assert show_call("add", {"a": 1, "b": 2}) == 'add({"a": 1, "b": 2})'  # not registered: name(arguments)
    assert show_call("code_interpreter", {"code": "print(1)"}) == "print(1)"


def test_the_agent_loop_records_what_the_named_tool_records(query, renderer, sandbox):
    turns = [
        call("query", sql="SELECT answer"),
        call("code_interpreter", code="print(6 * 7)"),
        call("add", a=2, b=3),
        call("query"),  # no sql: refused by the schema check, recorded as the tool records it (nothing)
        "\\boxed{42}",
    ]
    cfg = AgentConfig(max_response_tokens=4096, max_tokens_per_turn=1024)
    tools = ToolSet([CodeInterpreter(), query, add])
    loop = AgentLoop(ScriptedEngine(renderer, turns), renderer, sandbox, cfg, tools=tools)
    t = loop.run([[{"role": "user", "content": "q"}]], SamplingParams())[0]
    got = [(c.name, c.code, c.status, c.response) for c in t.tool_calls]
    assert got[:3] == [
        ("query", "SELECT answer", "ok", "42"),
        ("code_interpreter", "print(6 * 7)", "ok", "42\n"),
        ("add", None, "ok", "5"),
    ]
    assert got[3][:3] == ("query", None, "parse_error")
    assert Trajectory.from_dict(t.to_dict()) == t


def test_the_code_interpreter_is_registered_in_its_own_module():
    assert isinstance(registered_tool("code_interpreter"), CodeInterpreter)
    assert registered_tool(None) is None and registered_tool("query") is None
    assert recorded_code("code_interpreter", {"code": "print(1)"}) == "print(1)"
    assert recorded_code("code_interpreter", {"code": 3}) is None
    assert recorded_code("code_interpreter", None) is None
    assert recorded_code("lookup", {"code": "x"}) is None  # another tool's argument named code is not code
    assert recorded_code(None, None) is None  # too malformed to name a tool


def test_a_taken_name_is_refused_unless_replaced(monkeypatch):
    monkeypatch.setattr(registry, "_TOOLS", dict(registry._TOOLS))
    with pytest.raises(ValueError, match="'code_interpreter' is already registered \\(CodeInterpreter\\)"):
        register_tool(CodeInterpreter())
    mine = register_tool(CodeInterpreter(auto_print=False), replace=True)
    assert registered_tool("code_interpreter") is mine
    assert register_tool(mine) is mine  # the same tool again is no conflict
    with pytest.raises(TypeError, match="is not a tool"):
        register_tool(lambda key: key)  # type: ignore[arg-type]
