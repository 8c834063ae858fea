"""An MCP server with two small tools: the height of a mountain (a table lookup) and a length unit converter.

    python examples/mcp_tools/server.py   # speaks MCP over stdio; examples/mcp_tools/task.py starts it this way

It is written with the `mcp` package's server API (`pip install 'tirl[mcp]'`); neither tool runs code it is given.
The table and the conversion are plain functions above `main`, so the task computes its ground truths with the very
numbers the server answers, without importing `mcp`.
"""

from __future__ import annotations

import inspect
from typing import Literal

HEIGHTS_M = {  # metres above sea level
    "everest": 8849,
    "k2": 8611,
    "kangchenjunga": 8586,
    "lhotse": 8516,
    "makalu": 8485,
    "aconcagua": 6961,
    "denali": 6190,
    "kilimanjaro": 5895,
    "elbrus": 5642,
    "vinson": 4892,
    "mont blanc": 4806,
    "matterhorn": 4478,
    "whitney": 4421,
    "rainier": 4392,
    "fuji": 3776,
    "etna": 3357,
    "olympus": 2918,
    "kosciuszko": 2228,
    "ben nevis": 1345,
    "table mountain": 1085,
}

Unit = Literal["m", "km", "cm", "ft", "yd", "mi", "in"]
METRES_PER = {"m": 1.0, "km": 1000.0, "cm": 0.01, "ft": 0.3048, "yd": 0.9144, "mi": 1609.344, "in": 0.0254}


def mountain_height(name: str) -> str:
    """The height of a mountain in metres above sea level.

    Args:
        name: The mountain's English name, e.g. "Everest" or "Mont Blanc".
    """
    key = name.strip().lower().removeprefix("mount ").removeprefix("mt. ").removeprefix("mt ")
    if key not in HEIGHTS_M:
        raise ValueError(f"unknown mountain {name!r}; known: {', '.join(sorted(HEIGHTS_M))}")
    return f"{HEIGHTS_M[key]} m"


def convert_length(value: float, from_unit: Unit, to_unit: Unit) -> float:
    """Convert a length from one unit to another.

    Args:
        value: The length to convert.
        from_unit: Its unit.
        to_unit: The unit to convert it to.
    """
    return round(value * METRES_PER[from_unit] / METRES_PER[to_unit], 4)


def main() -> None:
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("tirl-example-mountains", log_level="WARNING")
    for fn in (mountain_height, convert_length):  # the docstring, dedented, is what the model reads
        server.tool(description=inspect.cleandoc(fn.__doc__ or ""), structured_output=False)(fn)
    server.run()  # stdio


if __name__ == "__main__":
    main()
