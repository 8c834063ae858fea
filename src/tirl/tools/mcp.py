"""The tools of a Model Context Protocol (MCP) server as tirl tools: `McpServer(command or URL).tools`.

    server = McpServer("python my_server.py")        # stdio: tirl starts the process
    server = McpServer("http://127.0.0.1:8000/mcp")   # streamable HTTP: tirl connects
    task = Task("my_task", tools=server.tools, ...)

The server is connected once, when built, and its tools listed with their JSON schemas; each becomes a `McpTool`
(`sandbox=False`, its schema in the OpenAI function form the chat renderer lists). A call is checked against its
schema before it is sent (as a function tool's: an unknown or missing argument, or a wrong type, answers an error
text and nothing is sent), runs within `timeout_s`, and answers the text content of the result, capped at
`max_output_chars`, with a note naming the non-text blocks it dropped; a result the server marks `isError` is a
"tool_error", a late call a "timeout", and a failed call an error text: none of them raises into the agent loop.

tirl does not sandbox an MCP server: the process runs as the user who started tirl, with that user's rights, and
the model's arguments reach it as written. Deliberately not here: the event loop and the process
(`tirl.tools.mcp_session`), resources, prompts and sampling (only tools are used).
"""

from __future__ import annotations

import concurrent.futures
import json
import shlex
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tirl.core.bounds import check_range
from tirl.sandbox.types import Sandbox
from tirl.tools.base import Tool, ToolOutput
from tirl.tools.mcp_session import McpServerError, McpSession, is_url, reasons
from tirl.tools.registry import register_tool, registered_tool

CALL_GRACE_S = 2.0  # past its own timeout, how long a call's answer is awaited before it is given up here


def result_output(result: Any, max_chars: int) -> ToolOutput:
    """A `CallToolResult` as the model reads it: its text blocks joined (the structured result as JSON if there
    are none), cut at `max_chars`, then a note naming the non-text blocks dropped; `isError` makes a "tool_error"."""
    text = "\n".join(b.text for b in result.content if b.type == "text")
    if not text and result.structured_content is not None:
        text = json.dumps(result.structured_content, ensure_ascii=False)
    if len(text) > max_chars:
        text = f"{text[:max_chars]}...(cut at {max_chars} of {len(text)} characters)"
    dropped = Counter(b.type for b in result.content if b.type != "text")
    if dropped:
        blocks = ", ".join(f"{n} {kind}" for kind, n in sorted(dropped.items()))
        text += f"\n(dropped non-text content: {blocks}; only text reaches the model)"
    if result.is_error:
        return ToolOutput(text.strip() or "Error: the tool failed and said nothing.", "tool_error")
    return ToolOutput(text if text.strip() else "(no output)", "ok")


class McpTool(Tool):
    """One tool of an MCP server, named `prefix + its name`; calls go to the server under its own name."""

    def __init__(self, server: McpServer, listed: Any, prefix: str) -> None:
        from jsonschema.validators import validator_for  # installed with mcp

        self.server = server
        self.remote_name: str = listed.name
        self.name = prefix + listed.name
        parameters = listed.input_schema
        self.schema = {
            "type": "function",
            "function": {
                "name": self.name,
                "description": listed.description or "",
                "parameters": parameters,
            },
        }
        self.sandbox = False
        cls = validator_for(parameters)
        try:
            cls.check_schema(parameters)
        except Exception as e:
            raise McpServerError(
                f"MCP server {server.name!r}: tool {self.remote_name!r} has an invalid input schema: {e}"
            ) from None
        self._validator = cls(parameters)

    def __repr__(self) -> str:
        return f"McpTool({self.name!r} of MCP server {self.server.name!r})"

    def validate(self, arguments: dict[str, Any]) -> str | None:
        """As a function tool's check, in the same words: an argument the schema does not list (unless it allows
        additional properties), a missing required one, then every other JSON Schema error, in one sentence."""
        params = self.schema["function"]["parameters"]
        props = params.get("properties") or {}
        problems = []
        unknown = [k for k in arguments if k not in props]
        if unknown and "properties" in params and params.get("additionalProperties") in (None, False):
            problems.append(
                f"unknown argument {', '.join(map(repr, unknown))} (valid: {', '.join(props) or 'none'})"
            )
        missing = [k for k in params.get("required", []) if k not in arguments]
        if missing:
            problems.append(f"missing required argument {', '.join(map(repr, missing))}")
        try:
            errors = sorted(self._validator.iter_errors(arguments), key=lambda e: list(map(str, e.path)))
        except Exception as e:  # a schema jsonschema cannot follow (a remote $ref): refused, never a crash
            return f"Error: tool {self.name!r} cannot check its arguments: {type(e).__name__}: {e}."
        for err in errors:
            if not err.path and err.validator in ("required", "additionalProperties"):
                continue  # said above
            where = f"argument {'.'.join(map(str, err.path))!r}: " if err.path else ""
            problems.append(where + err.message)
        if problems:
            return f"Error: bad arguments for tool {self.name!r}: {'; '.join(problems)}."
        return None

    def run_batch(self, arguments: Sequence[dict[str, Any]], sandbox: Sandbox | None) -> list[ToolOutput]:
        """All calls sent at once, each answered within `timeout_s` (plus a grace for the answer to arrive)."""
        timeout_s = self.server.timeout_s
        futures = [self.server.session.call(self.remote_name, a, timeout_s) for a in arguments]
        deadline = time.monotonic() + timeout_s + CALL_GRACE_S
        return [self._output(f, deadline) for f in futures]

    def _output(self, future: concurrent.futures.Future[Any], deadline: float) -> ToolOutput:
        try:
            result = future.result(timeout=max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            future.cancel()
            return ToolOutput(f"Error: {self.name} took longer than {self.server.timeout_s:g} s.", "timeout")
        except Exception as e:  # the server failed, refused the call or went away: information, not a crash
            return ToolOutput(
                f"Error: MCP server {self.server.name!r} failed on {self.name}: {reasons(e)}", "tool_error"
            )
        try:
            return result_output(result, self.server.max_output_chars)
        except Exception as e:  # a result that is not what MCP promised
            return ToolOutput(
                f"Error: MCP server {self.server.name!r} answered {self.name} oddly: {e}", "tool_error"
            )


class McpServer:
    """An MCP server's tools, connected once: `server` is a command line (a string, split as a shell would, or an
    argv list; tirl starts it and speaks stdio) or an http(s) URL (streamable HTTP). `prefix` goes before each tool
    name; `timeout_s` bounds each call; `max_output_chars` caps a result's text; `env` (added to a minimal
    environment: PATH, HOME, ...), `cwd` and `stderr_path` (where the process's stderr goes; default a temporary
    file an error quotes) are for a command. `close()` (or `with`) ends the session and stops the process."""

    def __init__(
        self,
        server: str | Sequence[str],
        *,
        prefix: str = "",
        name: str | None = None,
        timeout_s: float = 30.0,
        connect_timeout_s: float = 30.0,
        max_output_chars: int = 16_000,
        max_concurrent_calls: int = 16,
        env: Mapping[str, str] | None = None,
        cwd: str | Path | None = None,
        stderr_path: str | Path | None = None,
    ) -> None:
        command = [] if is_url(server) else (shlex.split(server) if isinstance(server, str) else list(server))
        if not is_url(server) and not command:
            raise ValueError("McpServer needs a command line or an http(s) URL, got an empty one")
        self.name = name or (str(server) if is_url(server) else shlex.join(command))
        for key, value, low in (("timeout_s", timeout_s, 0), ("connect_timeout_s", connect_timeout_s, 0)):
            check_range(f"McpServer({self.name!r}).{key}", value, low, low_open=True)
        for key, value in (
            ("max_output_chars", max_output_chars),
            ("max_concurrent_calls", max_concurrent_calls),
        ):
            check_range(f"McpServer({self.name!r}).{key}", value, 1)
        self.timeout_s = timeout_s
        self.max_output_chars = max_output_chars
        self.session = McpSession(
            server if is_url(server) else command,
            label=self.name,
            connect_timeout_s=connect_timeout_s,
            max_concurrent_calls=max_concurrent_calls,
            env=env,
            cwd=cwd,
            stderr_path=stderr_path,
        )
        try:
            self.tools: list[McpTool] = [McpTool(self, listed, prefix) for listed in self.session.tools]
            self._register()
        except BaseException:
            self.session.close()
            raise

    def _register(self) -> None:
        """Register the tools by name (records and the viewer show a call `name(arguments)`, as a function
        tool's); a name another tool holds is an error naming both, unless it is a tool of a closed MCP server."""
        for tool in self.tools:
            taken = registered_tool(tool.name)
            mine = isinstance(taken, McpTool) and (taken.server is self or taken.server.closed)
            if taken is not None and not mine:
                raise McpServerError(
                    f"MCP server {self.name!r} offers a tool named {tool.name!r}, which is taken by {taken!r}: "
                    "give the server a prefix (McpServer(..., prefix='NAME_'))"
                )
        for tool in self.tools:
            register_tool(tool, replace=True)

    @property
    def closed(self) -> bool:
        return self.session.closed

    def close(self) -> None:
        """End the session; a command's process is stopped (SIGTERM, then SIGKILL if it hangs). Idempotent; a call
        after it answers an error text."""
        self.session.close()

    def __enter__(self) -> McpServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"McpServer({self.name!r}, tools={[t.name for t in self.tools]})"
