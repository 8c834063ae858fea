"""Row schemas of the verl / Open-AgentRL datasets: validate one row, normalize it, or say exactly what is wrong.

RL/eval rows: `data_source` (str), `prompt` (list of chat messages), `ability` (str), `reward_model`
(`{ground_truth, style?}`) and `extra_info` (dict); `reward_model` and `extra_info` may arrive as JSON strings
(the LiveCodeBench eval parquet stores them so). SFT rows: `messages` (system/user/assistant/tool; assistant
`tool_calls` in the OpenAI form) and optional `tools` (function schemas).

Pure functions on dicts: the readers (readers.py) add the file and row number to every error raised here.
Not here: file formats, prompt wording (see benchmarks.py).
"""

from __future__ import annotations

import json
from typing import Any

ROLES = ("system", "user", "assistant", "tool")


class SchemaError(ValueError):
    """A row that does not fit its schema; `column` names the offending field (dotted for nested ones)."""

    def __init__(self, column: str | None, message: str) -> None:
        super().__init__(message)
        self.column = column
        self.message = message


class RowError(ValueError):
    """A bad row located in its file: the message names file, row number (1-based) and column."""

    def __init__(self, file: str, row: int | None, column: str | None, message: str) -> None:
        where = file if row is None else f"{file}: row {row}"
        if column:
            where += f", column {column!r}"
        super().__init__(f"{where}: {message}")
        self.file, self.row, self.column, self.message = file, row, column, message


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _maybe_json(value: Any, column: str, expected: type) -> Any:
    """Decode a JSON string standing in for a dict/list (verl files store nested columns both ways)."""
    if isinstance(value, str) and expected is not str:
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise SchemaError(
                column, f"expected {expected.__name__} or a JSON string of one, got unparsable JSON ({e.msg})"
            ) from None
    if not isinstance(value, expected):
        raise SchemaError(column, f"expected {expected.__name__}, got {_type_name(value)}")
    return value


def _require(row: dict[str, Any], column: str) -> Any:
    if column not in row:
        raise SchemaError(column, f"missing column (row has: {', '.join(sorted(row)) or 'nothing'})")
    return row[column]


def _message(msg: Any, column: str) -> dict[str, Any]:
    if not isinstance(msg, dict):
        raise SchemaError(column, f"expected a chat message (dict), got {_type_name(msg)}")
    m = {k: v for k, v in msg.items() if v is not None}  # parquet structs fill absent fields with null
    role = m.get("role")
    if role not in ROLES:
        raise SchemaError(f"{column}.role", f"expected one of {', '.join(ROLES)}, got {role!r}")
    content = m.get("content", "")
    if not isinstance(content, str):
        raise SchemaError(f"{column}.content", f"expected str, got {_type_name(content)}")
    m["content"] = content
    calls = m.get("tool_calls")
    if hasattr(calls, "tolist"):  # numpy arrays from pandas-written parquet
        calls = calls.tolist()
    if calls is not None and not isinstance(calls, list):
        raise SchemaError(f"{column}.tool_calls", f"expected a list of tool calls, got {_type_name(calls)}")
    if calls is not None and len(calls) == 0:
        del m["tool_calls"]
    elif calls is not None:
        if role != "assistant":
            raise SchemaError(f"{column}.tool_calls", f"only assistant messages call tools, not {role!r}")
        m["tool_calls"] = [_tool_call(c, f"{column}.tool_calls[{i}]") for i, c in enumerate(calls)]
    return m


def _tool_call(call: Any, column: str) -> dict[str, Any]:
    if not isinstance(call, dict):
        raise SchemaError(column, f"expected a tool call (dict), got {_type_name(call)}")
    fn = call.get("function", call)
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise SchemaError(f"{column}.function.name", "expected a function name (str)")
    args = fn.get("arguments", {})
    args = _maybe_json(args, f"{column}.function.arguments", dict)
    return {"type": "function", "function": {"name": fn["name"], "arguments": args}}


def _messages(value: Any, column: str) -> list[dict[str, Any]]:
    if hasattr(value, "tolist"):  # numpy arrays from pandas-written parquet
        value = value.tolist()
    if not isinstance(value, list) or not value:
        raise SchemaError(column, f"expected a non-empty list of chat messages, got {_type_name(value)}")
    msgs = [_message(m, f"{column}[{i}]") for i, m in enumerate(value)]
    for i, m in enumerate(msgs):
        if m["role"] == "system" and i != 0:
            raise SchemaError(f"{column}[{i}].role", "a system message is only allowed first")
    return msgs


def validate_rl_row(row: dict[str, Any]) -> dict[str, Any]:
    """The row with JSON-string columns decoded and messages cleaned; raises SchemaError naming the column."""
    out = dict(row)
    source = _require(row, "data_source")
    if not isinstance(source, str) or not source:
        raise SchemaError("data_source", f"expected a non-empty str, got {source!r}")
    out["prompt"] = _messages(_require(row, "prompt"), "prompt")
    if out["prompt"][-1]["role"] != "user":
        raise SchemaError(
            "prompt", f"the last prompt message must be a user turn, got {out['prompt'][-1]['role']!r}"
        )
    ability = row.get("ability", "")
    if not isinstance(ability, str):
        raise SchemaError("ability", f"expected str, got {_type_name(ability)}")
    out["ability"] = ability
    rm = _maybe_json(_require(row, "reward_model"), "reward_model", dict)
    if "ground_truth" not in rm or rm["ground_truth"] is None:
        raise SchemaError("reward_model.ground_truth", "missing (every RL/eval row needs an answer to grade)")
    gt = rm["ground_truth"]
    if isinstance(gt, (int, float)) and not isinstance(gt, bool):
        gt = str(gt)
    if not isinstance(gt, (str, dict, list)):
        raise SchemaError("reward_model.ground_truth", f"expected str, dict or list, got {_type_name(gt)}")
    out["reward_model"] = {**rm, "ground_truth": gt}
    info = row.get("extra_info")
    out["extra_info"] = {} if info is None else _maybe_json(info, "extra_info", dict)
    return out


def validate_sft_row(row: dict[str, Any]) -> dict[str, Any]:
    out = dict(row)
    msgs = _messages(_require(row, "messages"), "messages")
    if not any(m["role"] == "assistant" for m in msgs):
        raise SchemaError("messages", "no assistant message: nothing to train on")
    out["messages"] = msgs
    tools = row.get("tools")
    if tools is not None:
        if hasattr(tools, "tolist"):
            tools = tools.tolist()
        if isinstance(tools, str):
            tools = _maybe_json(tools, "tools", list)
        if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
            raise SchemaError(
                "tools", f"expected a list of function schemas (dicts), got {_type_name(tools)}"
            )
        out["tools"] = [_drop_nulls(t) for t in tools]
    return out


def _drop_nulls(value: Any) -> Any:
    """Parquet stores a list of schemas as one struct type, filling each schema's absent fields with null; the
    chat template must list the schemas as written, so the nulls go."""
    if isinstance(value, dict):
        return {k: _drop_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_nulls(v) for v in value]
    return value


def validate_completion_row(row: dict[str, Any]) -> dict[str, Any]:
    """TRL's plain `prompt`/`completion` strings (the demo's copy warm-up): loss on the completion."""
    for col in ("prompt", "completion"):
        if not isinstance(_require(row, col), str):
            raise SchemaError(col, f"expected str, got {_type_name(row[col])}")
    return dict(row)


VALIDATORS = {"rl": validate_rl_row, "sft": validate_sft_row, "completion": validate_completion_row}


def detect_kind(row: dict[str, Any]) -> str:
    """'sft' for rows with `messages`, 'completion' for string prompt/completion pairs, 'rl' for rows with a
    `prompt`; SchemaError otherwise."""
    if "messages" in row:
        return "sft"
    if isinstance(row.get("prompt"), str) and "completion" in row:
        return "completion"
    if "prompt" in row:
        return "rl"
    raise SchemaError(
        "prompt",
        f"neither an RL row (`prompt`) nor an SFT row (`messages`); columns: {', '.join(sorted(row))}",
    )
