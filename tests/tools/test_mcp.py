"""An MCP server's tools are tirl tools: listed with their schemas, checked like function tools, answered within their
timeout (late, failing and closed calls answer an error text, never raise), capped, and the server process is gone
after close() even when it ignores SIGTERM. The server is mcp_test_server.py beside this file, written with the `mcp`
package's own server API; the slowest part of each test is starting it (~2 s: importing mcp)."""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("mcp")
mcp_stdio = pytest.importorskip("mcp.client.stdio")

from tirl.chat.tool_formats.hermes import call_json, parse_tool_calls  # noqa: E402
from tirl.rollout.agent.loop import AgentConfig, AgentLoop  # noqa: E402
from tirl.rollout.engines.base import RemoteModel  # noqa: E402
from tirl.rollout.sampling import SamplingParams  # noqa: E402
from tirl.rollout.types import Generation  # noqa: E402
from tirl.tools import ToolSet, registered_tool, registry, show_call, tool  # noqa: E402
from tirl.tools.mcp import McpServer, McpServerError, McpTool  # noqa: E402
from tirl.tools.mcp_session import CLOSE_TIMEOUT_S  # noqa: E402

SERVER = [sys.executable, str(Path(__file__).with_name("mcp_test_server.py"))]


@pytest.fixture(scope="module")
def server():
    """One test server for the module, its tools registered in a copy of the registry that is dropped after."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(registry, "_TOOLS", dict(registry._TOOLS))
        with McpServer(SERVER, timeout_s=2.0, max_output_chars=50) as s:
            yield s


def tools_of(server: McpServer) -> ToolSet:
    return ToolSet(server.tools)


def run(tools: ToolSet, *calls: tuple[str, dict]) -> list[tuple[str, str]]:
    text = "".join(f"<tool_call>\n{call_json(name, args)}\n</tool_call>" for name, args in calls)
    return [(o.status, o.text) for o in tools.execute(parse_tool_calls(text), None, max_chars=10_000)]


def alive(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie, exited but not reaped, counts as alive: it was not waited for)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_the_tools_are_listed_in_the_function_form_the_prompt_lists(server):
    assert [t.name for t in server.tools] == ["add", "echo", "fail", "sleep", "picture", "pid", "hang"]
    add = server.tools[0]
    assert isinstance(add, McpTool) and add.sandbox is False
    assert add.schema == {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {
                    "a": {"title": "A", "type": "integer"},
                    "b": {"title": "B", "type": "integer"},
                },
                "required": ["a", "b"],
                "title": "addArguments",
            },
        },
    }


def test_the_viewer_shows_a_call_as_it_shows_a_function_tools(server):
    assert registered_tool("add") is server.tools[0]
    assert show_call("add", {"a": 1, "b": 2}) == 'add({"a": 1, "b": 2})'


def test_good_calls_answer_and_bad_arguments_are_refused_before_sending(server):
    assert run(
        tools_of(server),
        ("add", {"a": 2, "b": 3}),
        ("add", {"a": 2, "b": "3"}),
        ("add", {"a": 2, "c": 3}),
        ("echo", {"text": "hi", "times": 2}),
        ("echo", {"text": "hi"}),
    ) == [
        ("ok", "5"),
        ("parse_error", "Error: bad arguments for tool 'add': argument 'b': '3' is not of type 'integer'."),
        ("parse_error", "Error: bad arguments for tool 'add': unknown argument 'c' (valid: a, b); "
                        "missing required argument 'b'."),
        ("ok", "hihi"),
        ("ok", "hi"),  # an optional argument left out takes the server's default
    ]  # fmt: skip


def test_arguments_are_checked_against_the_json_schema_a_server_writes():
    """Full JSON Schema, beyond what function tools' schemas use: `X | None` as anyOf, nested objects, enums."""
    schema = {
        "type": "object",
        "properties": {
            "query": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None},
            "filter": {"type": "object", "properties": {"year": {"type": "integer", "minimum": 1900}}},
            "order": {"enum": ["asc", "desc"]},
        },
        "required": ["order"],
    }
    listed = SimpleNamespace(name="find", description=None, input_schema=schema)
    find = McpTool(SimpleNamespace(name="fake"), listed, prefix="db_")
    assert find.name == "db_find" and find.schema["function"]["description"] == ""
    assert find.validate({"query": None, "order": "asc"}) is None
    assert find.validate({"query": "x", "filter": {"year": 1850}, "order": "up"}) == (
        "Error: bad arguments for tool 'db_find': argument 'filter.year': 1850 is less than the minimum of 1900; "
        "argument 'order': 'up' is not one of ['asc', 'desc']."
    )


def test_a_server_side_error_is_a_tool_error(server):
    assert run(tools_of(server), ("fail", {"message": "no such row"})) == [
        ("tool_error", "Error executing tool fail: no such row")
    ]


def test_a_late_call_answers_a_timeout_and_the_server_goes_on_answering(server):
    start = time.monotonic()
    assert run(tools_of(server), ("sleep", {"seconds": 30}), ("add", {"a": 1, "b": 1})) == [
        ("timeout", "Error: sleep took longer than 2 s."),
        ("ok", "2"),
    ]
    assert time.monotonic() - start < 10  # 2 s measured: the call is given up, not waited for
    assert run(tools_of(server), ("add", {"a": 2, "b": 2})) == [("ok", "4")]


def test_long_output_is_capped_and_dropped_non_text_content_is_named(server):
    assert run(tools_of(server), ("echo", {"text": "ab", "times": 40}), ("picture", {})) == [
        ("ok", "ab" * 25 + "...(cut at 50 of 80 characters)"),
        ("ok", "a dot\n(dropped non-text content: 1 image; only text reaches the model)"),
    ]


def test_the_agent_loop_sends_a_models_call_to_the_server_and_reads_its_answer(server, renderer):
    class ScriptedEngine(RemoteModel):
        def __init__(self, turns):
            self.turns = turns

        def generate(self, prompts, params, *, max_new_tokens=None, generator=None):
            ids = renderer.encode(self.turns.pop(0))
            reason = "stop" if ids[-1] == renderer.tool_call_end_id else "eos"
            ids = ids if reason == "stop" else ids + [renderer.eos_id]
            return [Generation(ids, [-0.5] * len(ids), reason)]

    turns = [f"<tool_call>\n{call_json('add', {'a': 20, 'b': 22})}\n</tool_call>", "\\boxed{42}"]
    cfg = AgentConfig(max_response_tokens=4096, max_tokens_per_turn=1024)
    loop = AgentLoop(ScriptedEngine(turns), renderer, None, cfg, tools=tools_of(server))
    (t,) = loop.run([[{"role": "user", "content": "What is 20 + 22?"}]], SamplingParams())
    assert [(c.name, c.arguments, c.status, c.response) for c in t.tool_calls] == [
        ("add", {"a": 20, "b": 22}, "ok", "42")
    ]
    tool_ids = [i for i, m in zip(t.response_ids, t.loss_mask) if not m]
    assert tool_ids == renderer.tool_response_ids(["42"], assistant_closed=False)  # the answer, as tokens
    assert t.stop_reason == "answer"


def test_a_name_another_tool_holds_is_refused_naming_the_server(server):
    with pytest.raises(McpServerError, match=f"MCP server '{server.name}' offers a tool named 'add', which is "
                       f"taken by McpTool\\('add' of MCP server '{server.name}'\\): give the server a prefix"):  # fmt: skip
        McpServer(SERVER)  # the same tools again, unprefixed (the tests below prefix theirs)

    @tool(sandbox=False)
    def add(a: int) -> int:
        """A function tool with an MCP tool's name.

        Args:
            a: A number.
        """
        return a

    with pytest.raises(ValueError, match=r"two tools are named 'add': McpTool\('add' of MCP server '.+'\) and "
                       r"FunctionTool\('add'\)"):  # fmt: skip
        ToolSet([*server.tools, add])


def test_close_leaves_no_process_even_when_the_server_ignores_sigterm(monkeypatch):
    monkeypatch.setattr(registry, "_TOOLS", dict(registry._TOOLS))
    # the mcp stdio transport's own escalation (stdin closed, SIGTERM, SIGKILL), its 2 s waits shortened
    monkeypatch.setattr(mcp_stdio, "PROCESS_TERMINATION_TIMEOUT", 0.2)
    monkeypatch.setattr(mcp_stdio, "FORCE_KILL_TIMEOUT", 0.2)
    server = McpServer(
        SERVER, timeout_s=1.0, prefix="own_"
    )  # its own names: the module's server holds add, ...
    tools = tools_of(server)
    ((_, pid),) = run(tools, ("own_pid", {}))
    assert run(tools, ("own_hang", {})) == [("timeout", "Error: own_hang took longer than 1 s.")]
    assert alive(int(pid))
    start = time.monotonic()
    server.close()
    assert time.monotonic() - start < CLOSE_TIMEOUT_S  # ~0.5 s measured
    assert not alive(int(pid))
    status, text = run(tools, ("own_add", {"a": 1, "b": 2}))[0]
    assert status == "tool_error" and text.endswith(
        "failed on own_add: ConnectionError: the session is closed"
    )
    server.close()  # idempotent


def test_a_server_that_dies_mid_run_answers_an_error_at_once(monkeypatch):
    monkeypatch.setattr(registry, "_TOOLS", dict(registry._TOOLS))
    with McpServer(SERVER, timeout_s=30.0, prefix="dying_") as server:
        tools = tools_of(server)
        ((_, pid),) = run(tools, ("dying_pid", {}))
        os.kill(int(pid), signal.SIGKILL)
        start = time.monotonic()
        assert run(tools, ("dying_add", {"a": 1, "b": 2}))[0][0] == "tool_error"
        assert time.monotonic() - start < 5  # ~0.01 s measured: not the 30 s timeout


@pytest.mark.parametrize(
    "command, said",
    [
        (
            [sys.executable, "-c", "import sys; sys.exit('no config file found')"],
            "its stderr ends:\nno config file",
        ),
        (["/nonexistent/mcp-server"], "FileNotFoundError"),
    ],
)
def test_a_server_that_does_not_start_is_an_error_naming_it(command, said):
    start = time.monotonic()
    with pytest.raises(McpServerError, match="failed to start or to connect") as e:
        McpServer(command, name="broken")
    assert "MCP server 'broken'" in str(e.value) and said in str(e.value)
    assert time.monotonic() - start < 5  # it fails when the process exits, not at connect_timeout_s


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_url_that_does_not_answer_is_an_error_naming_it():
    url = f"http://127.0.0.1:{free_port()}/mcp"
    with pytest.raises(
        McpServerError, match=f"MCP server '{url}' failed to start or to connect: .*ConnectError"
    ):
        McpServer(url)


def test_streamable_http_lists_and_calls(monkeypatch):
    monkeypatch.setattr(registry, "_TOOLS", dict(registry._TOOLS))
    port = free_port()
    proc = subprocess.Popen(
        [*SERVER, "--http", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:  # until uvicorn listens
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.05)
        with McpServer(f"http://127.0.0.1:{port}/mcp", prefix="web_") as remote:
            assert [t.name for t in remote.tools][:2] == ["web_add", "web_echo"]
            assert run(tools_of(remote), ("web_add", {"a": 4, "b": 5}), ("web_fail", {"message": "x"})) == [
                ("ok", "9"),
                ("tool_error", "Error executing tool fail: x"),
            ]
    finally:
        proc.kill()
        proc.wait()


def test_without_the_mcp_package_the_error_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "mcp", None)
    with pytest.raises(ImportError, match=r"pip install 'tirl\[mcp\]'"):
        McpServer(SERVER)


def test_bad_settings_fail_before_anything_starts():
    with pytest.raises(ValueError, match="timeout_s"):
        McpServer(SERVER, timeout_s=0)
    with pytest.raises(ValueError, match="a command line or an http"):
        McpServer("")
