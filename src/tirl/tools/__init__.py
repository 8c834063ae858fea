"""Tools for the agent loop: typed Python functions whose schemas tirl derives, and the sandboxed code interpreter.

from tirl.tools import tool

@tool(sandbox=False)
def lookup(key: str) -> str:
    '''Look up a key in the table.

    Args:
        key: The row to read.
    '''
    return TABLE.get(key, "not found")

A `Tool` subclass registered by name (`register_tool(MyTool())`) is also found by trajectory records and the
trajectory viewer (`tirl.tools.registry`). An MCP server's tools: `McpServer("python server.py").tools`
(`tirl.tools.mcp`, with the `mcp` package: `pip install 'tirl[mcp]'`).
"""

from tirl.tools.base import FunctionTool, Tool, ToolOptions, ToolOutput, ToolSet, tool
from tirl.tools.code_interpreter import CodeInterpreter, default_tools
from tirl.tools.mcp import McpServer, McpServerError, McpTool
from tirl.tools.registry import recorded_code, register_tool, registered_tool, show_call
from tirl.tools.schema import check_arguments, function_schema

__all__ = [
    "CodeInterpreter",
    "FunctionTool",
    "McpServer",
    "McpServerError",
    "McpTool",
    "Tool",
    "ToolOutput",
    "ToolOptions",
    "ToolSet",
    "check_arguments",
    "default_tools",
    "function_schema",
    "recorded_code",
    "register_tool",
    "registered_tool",
    "show_call",
    "tool",
]
