"""`chat.history: per_turn`: a conversation trained as one sample per assistant turn, for a chat template that
re-renders history (strips earlier turns' reasoning, drops a separator), which no single token stream renders.

Sample k is what a model serving the template sees and writes at assistant turn k: the prompt is the template's
own text of the conversation before the turn with its generation header, encoded whole (not trained); the target is
the turn's text up to and including the end-of-turn token (trained); nothing follows it. Where the history is not
rewritten (a hand-written format, a template that passes the check), sample k is the whole conversation's pieces
cut after turn k, earlier turns not trained: the very stream sampling builds.

Deliberately not here: RL and sampling. A rollout is one token stream extended turn by turn, which such a template
cannot give; `one_stream_refusal` is the message with which the renderer refuses it (`ChatRenderer.prompt_ids`,
`tool_response_ids`, and the stages before an engine starts).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from tirl.chat.hf_template import HistoryRewrite, TemplateFormat
from tirl.chat.pieces import Piece

HISTORY = ("exact", "per_turn")  # chat.history


def template_turns(
    fmt: TemplateFormat, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None
) -> list[list[Piece]]:
    """The pieces of each assistant turn's sample: the template's prompt before it, then the turn (trainable)."""
    out = []
    for k, m in enumerate(messages):
        if m.get("role") != "assistant":
            continue
        prompt = fmt.render(messages[:k], tools=tools, add_generation_prompt=True)
        whole = fmt.render(messages[: k + 1], tools=tools)
        if not whole.startswith(prompt):  # the turn's own rendering rewrites its prompt: no target to cut
            raise HistoryRewrite(k, "assistant", prompt, whole)
        out.append([Piece(prompt, False), fmt.split_turn(whole[len(prompt) :])[0]])
    return out


def cut_turns(
    messages: Sequence[dict[str, Any]], pieces_of: Callable[[Sequence[dict[str, Any]]], list[Piece]]
) -> list[list[Piece]]:
    """Each assistant turn's sample from a prefix-preserving renderer: `pieces_of(messages[:k + 1])` up to its
    last trainable piece, earlier turns' pieces not trainable."""
    out = []
    for k, m in enumerate(messages):
        if m.get("role") != "assistant":
            continue
        pieces = pieces_of(messages[: k + 1])
        last = max(i for i, p in enumerate(pieces) if p.trainable)
        start = max((i for i, p in enumerate(pieces[:last]) if not p.trainable), default=-1) + 1
        out.append([replace(p, trainable=start <= i) for i, p in enumerate(pieces[: last + 1])])
    return out


def one_stream_refusal(what: str, divergence: str) -> str:
    """Why `what` (RL, evaluation, sampling) cannot run under chat.history=per_turn with this template, and what
    to do instead."""
    return (
        f"chat.history=per_turn: {what} needs each conversation as one token stream, extended turn by turn, and "
        f"this chat template does not give one: {divergence}\nper_turn trains such a template with SFT only (one "
        "sample per assistant turn); to sample or run RL, use a template that keeps history (one that passes "
        "chat.history=exact's check) or a hand-written chat.format"
    )
