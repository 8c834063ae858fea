"""Tool schemas derived from signatures and docstrings, against hand-written ones and Hugging Face's derivation."""

from typing import Literal

import pytest

from tirl.tools import check_arguments, function_schema, tool


def lookup(key: str, limit: int = 3, mode: Literal["exact", "prefix"] = "exact", scale: float | None = None,
           tags: list[str] | None = None) -> str:  # fmt: skip
    """Look up a key in the table.

    Rows are matched case-insensitively.

    Args:
        key: The key to find.
        limit: How many rows to return,
            at most.
        mode: How to match.
        scale: A factor applied to numbers.
        tags: Only rows with these tags.

    Returns:
        The matching rows.
    """
    return key


LOOKUP_SCHEMA = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Look up a key in the table.\n\nRows are matched case-insensitively.",
        "parameters": {
            "type": "object",
            "properties": {
                "key": {"type": "string", "description": "The key to find."},
                "limit": {"type": "integer", "description": "How many rows to return, at most."},
                "mode": {"type": "string", "enum": ["exact", "prefix"], "description": "How to match."},
                "scale": {"type": "number", "nullable": True, "description": "A factor applied to numbers."},
                "tags": {
                    "type": "array",
                    "items": {"type": "string"},
                    "nullable": True,
                    "description": "Only rows with these tags.",
                },
            },
            "required": ["key"],
        },
    },
}


def test_schema_from_signature_equals_the_hand_written_one():
    assert function_schema(lookup) == LOOKUP_SCHEMA
    # key order matters: the chat template serializes the dict as it is
    assert list(function_schema(lookup)["function"]) == ["name", "description", "parameters"]


def test_schema_matches_hugging_face_get_json_schema():
    """The layout transformers' apply_chat_template(tools=[fn]) gives Qwen's template (minus the return value)."""
    from transformers.utils import get_json_schema

    hf = get_json_schema(lookup)
    hf["function"].pop("return")
    assert function_schema(lookup) == hf


def test_undescribable_functions_fail_naming_the_problem():
    def no_doc(x: int) -> int:
        return x

    def no_hint(x) -> int:
        """Doc."""
        return x

    def bad_type(x: object) -> int:
        """Doc."""
        return 1

    with pytest.raises(ValueError, match="no docstring"):
        function_schema(no_doc)
    with pytest.raises(TypeError, match="argument 'x': missing a type hint"):
        function_schema(no_hint)
    with pytest.raises(TypeError, match="argument 'x': cannot describe type"):
        function_schema(bad_type)


def test_tool_must_declare_where_it_runs():
    with pytest.raises(TypeError):
        tool(lookup)  # sandbox= is required
    with pytest.raises(ValueError, match="sandbox=False"):
        tool(lookup, sandbox=True)
    t = tool(lookup, sandbox=False)
    assert t.name == "lookup" and t.sandbox is False and t("k") == "k"


@pytest.mark.parametrize(
    ("args", "error"),
    [
        ({"key": "a"}, None),
        ({"key": "a", "limit": 2, "scale": 1, "tags": ["x"], "mode": "prefix"}, None),  # int is a number
        ({"key": "a", "scale": None}, None),
        ({}, "missing required argument 'key'"),
        ({"key": "a", "colour": 1}, "unknown argument 'colour' (valid: key, limit, mode, scale, tags)"),
        ({"key": 5}, "argument 'key' must be string, got integer 5"),
        ({"key": "a", "limit": "2"}, "argument 'limit' must be integer, got string '2'"),
        ({"key": "a", "limit": True}, "argument 'limit' must be integer, got boolean True"),
        ({"key": "a", "mode": "fuzzy"}, "argument 'mode' must be one of ['exact', 'prefix'], got 'fuzzy'"),
        ({"key": "a", "tags": ["x", 2]}, "argument 'tags'[1] must be string, got integer 2"),
        ({"key": None}, "argument 'key' must not be null"),
    ],
)
def test_check_arguments(args, error):
    got = check_arguments(LOOKUP_SCHEMA, args)
    if error is None:
        assert got is None
    else:
        assert got == f"Error: bad arguments for tool 'lookup': {error}."
