"""The check `chat.format: template` passes before anything trains or samples: on a synthetic multi-turn tool
conversation, the agent loop's token stream (prompt, each sampled turn with its end-of-turn token, each tool turn)
equals the whole conversation rendered as pieces, id for id, with the loss mask 1 exactly on the sampled tokens,
and every rendering extends the one before (no history re-rendered).

A template that fails is refused with its first divergence: the message and character where the texts part
(`HistoryRewrite`), or the token position with both sides' ids and text; under `chat.history: per_turn` the
divergence is kept instead (SFT trains each turn as its own sample, `tirl.chat.per_turn`, whose samples of the
same conversation must render) and sampling is refused with it. Deliberately not here: rendering
(`tirl.chat.hf_template`) and checking stored files (`tirl.chat.tokcheck`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from tirl.chat.hf_template import TemplateFormat
from tirl.chat.per_turn import HISTORY, template_turns
from tirl.chat.pieces import Piece, encode_piece
from tirl.chat.tool_formats import PROBE_ARGUMENTS, PROBE_TOOL, ToolFormat

CONTEXT_TOKENS = 6


def synthetic_conversation(tools: Sequence[dict[str, Any]] = ()) -> list[dict[str, Any]]:
    """System, user, an assistant turn with reasoning and a tool call, the tool's answer, a final assistant turn,
    then a second user question and answer (a template that strips earlier reasoning shows it there)."""
    name = tools[0].get("function", tools[0])["name"] if tools else PROBE_TOOL
    call = {"type": "function", "function": {"name": name, "arguments": dict(PROBE_ARGUMENTS)}}
    return [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is 6 * 7?"},
        {
            "role": "assistant",
            "content": "<think>\nI should compute it.\n</think>\n\nLet me compute it.",
            "tool_calls": [call],
        },
        {"role": "tool", "content": "42"},
        {"role": "assistant", "content": "The answer is \\boxed{42}."},
        {"role": "user", "content": "And 2 + 2?"},
        {"role": "assistant", "content": "\\boxed{4}"},
    ]


def _encode(fmt: TemplateFormat, pieces: Sequence[Piece]) -> tuple[list[int], list[int]]:
    ids: list[int] = []
    mask: list[int] = []
    for p in pieces:
        t = encode_piece(fmt.tokenizer, p)
        ids += t
        mask += [int(p.trainable)] * len(t)
    return ids, mask


def loop_stream(
    fmt: TemplateFormat, conv: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]]
) -> tuple[list[int], list[int]]:
    """The ids and mask the agent loop builds for `conv` (one user turn, then assistant and tool turns): the
    prompt, each assistant turn as sampled ids (its text, then the end-of-turn id), each tool turn's ids."""
    eos = fmt.tokenizer.convert_tokens_to_ids(fmt.eos_text)
    start = next(k for k, m in enumerate(conv) if m["role"] == "assistant")
    ids, mask = _encode(fmt, fmt.pieces(conv[:start], tools=tools, add_generation_prompt=True))
    for k in range(start, len(conv)):
        m = conv[k]
        if m["role"] == "assistant":
            sampled = fmt.tokenizer.encode(fmt.assistant_text(m), add_special_tokens=False) + [eos]
            ids, mask = ids + sampled, mask + [1] * len(sampled)
        elif conv[k - 1]["role"] != "tool":  # the first of a run of tool messages: one tool turn
            run = [x["content"] for x in conv[k:]][: _tool_run(conv, k)]
            tool = _encode(fmt, fmt.tool_pieces(run, tools=tools))[0]
            ids, mask = ids + tool, mask + [0] * len(tool)
    return ids, mask


def _tool_run(conv: Sequence[dict[str, Any]], k: int) -> int:
    n = 0
    while k + n < len(conv) and conv[k + n]["role"] == "tool":
        n += 1
    return n


def _divergence(what: str, a: Sequence[int], b: Sequence[int], decode: Callable[[list[int]], str]) -> str:
    i = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    lo, hi = max(0, i - CONTEXT_TOKENS), i + CONTEXT_TOKENS + 1
    return (
        f"the {what} differ at token {i}\n  turn by turn: {list(a[lo:hi])} {decode(list(a[lo:hi]))!r}\n"
        f"  whole       : {list(b[lo:hi])} {decode(list(b[lo:hi]))!r}"
    )


def check_template(fmt: TemplateFormat, tools: Sequence[dict[str, Any]] = ()) -> None:
    """Refuse (ValueError naming the first divergence) a template whose turn-by-turn rendering is not the whole
    conversation's."""
    conv = synthetic_conversation(tools)
    fmt.pieces(conv, tools=tools)  # every rendering extends the one before: raises HistoryRewrite otherwise
    tool_part = conv[:5]  # the loop's stream covers one user turn, then assistant and tool turns
    stream = loop_stream(fmt, tool_part, tools)
    n = len(
        stream[0]
    )  # the loop stops at the last end-of-turn id; the template's tail after it is not sampled
    whole = [x[:n] if len(x) > n else x for x in _encode(fmt, fmt.pieces(tool_part, tools=tools))]
    decode = lambda ids: fmt.tokenizer.decode(ids, skip_special_tokens=False)  # noqa: E731
    for what, a, b in (("ids", stream[0], whole[0]), ("loss masks", stream[1], whole[1])):
        if list(a) != list(b):
            raise ValueError(
                "chat.format=template: rendering turn by turn does not give the whole conversation's "
                + _divergence(what, a, b, decode if what == "ids" else lambda x: "")
            )


def checked_template(
    tokenizer: Any,
    tool_fmt: ToolFormat | None,
    tools: Sequence[dict[str, Any]],
    *,
    enable_thinking: bool = True,
    history: str = "exact",
) -> tuple[TemplateFormat, str | None]:
    """The tokenizer's template as a `TemplateFormat` (`tool_fmt` None: its own tool calls), checked: with
    history `exact` a failing check raises; with `per_turn` its message is returned as the divergence (None: the
    template keeps history) once each turn's sample of the synthetic conversation renders."""
    if history not in HISTORY:
        raise ValueError(f"unknown chat.history {history!r}; valid: {', '.join(HISTORY)}")
    fmt = TemplateFormat(tokenizer, tool_fmt, enable_thinking=enable_thinking, tools=tools)
    try:
        check_template(fmt, tools)
    except ValueError as e:
        if history == "exact":
            raise
        template_turns(fmt, synthetic_conversation(tools), tools)
        return fmt, str(e)
    return fmt, None
