"""ChatML rendering with Hermes tool calls, token by token, so that rollouts never re-tokenize their history.

A conversation is rendered as a list of text pieces, each encoded on its own and tagged trainable or not. The agent
loop builds its tool-response tokens from the same piece functions, so the ids of a conversation rendered turn by
turn equal the ids of the whole conversation rendered at once (prefix-preserving), and `loss_mask` is explicit:
1 on assistant content and its closing `<|im_end|>`, 0 on headers, system, user and tool turns.

The layout matches Qwen2.5's template (ChatML, tool results as `<tool_response>` inside a user turn). The Jinja
version below is stored with the tiny tokenizer so that `tokenizer.apply_chat_template` renders the same text.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tirl.chat.hermes import TOOL_CALL_END, TOOL_CALL_START, call_json

IM_START, IM_END = "<|im_start|>", "<|im_end|>"

CHATML_JINJA = (
    "{%- for message in messages %}"
    "{%- if message.role == 'tool' %}"
    "{%- if loop.index0 == 0 or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- elif message.role == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' }}{%- if message.content %}{{- message.content }}{%- endif %}"
    "{%- for tc in message.tool_calls or [] %}"
    "{%- if tc.function is defined %}{%- set tc = tc.function %}{%- endif %}"
    "{%- if message.content or not loop.first %}{{- '\\n' }}{%- endif %}"
    "{{- '<tool_call>\\n{\"name\": \"' + tc.name + '\", \"arguments\": ' + (tc.arguments | tojson) + '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


@dataclass(frozen=True)
class Piece:
    text: str
    trainable: bool


def _tool_call_text(call: dict[str, Any]) -> str:
    fn = call.get("function", call)
    args = fn["arguments"]
    if isinstance(args, str):
        args = json.loads(args)
    return f"{TOOL_CALL_START}\n{call_json(fn['name'], args)}\n{TOOL_CALL_END}"


def assistant_body(message: dict[str, Any]) -> str:
    """The text an assistant turn generates: its content, then each tool call on its own line."""
    parts = [message.get("content") or ""]
    for i, call in enumerate(message.get("tool_calls") or []):
        if parts[0] or i:
            parts.append("\n")
        parts.append(_tool_call_text(call))
    return "".join(parts)


def tool_turn_pieces(contents: Sequence[str]) -> list[Piece]:
    """One user turn carrying consecutive tool results (never trained on)."""
    text = IM_START + "user"
    for c in contents:
        text += f"\n<tool_response>\n{c}\n</tool_response>"
    return [Piece(text + IM_END, False), Piece("\n", False)]


def generation_prompt() -> Piece:
    return Piece(f"{IM_START}assistant\n", False)


def conversation_pieces(
    messages: Sequence[dict[str, Any]], *, add_generation_prompt: bool = False
) -> list[Piece]:
    """The pieces of a whole conversation; validates roles so that a malformed row fails loudly."""
    pieces: list[Piece] = []
    i = 0
    while i < len(messages):
        m = messages[i]
        role = m.get("role")
        if role == "tool":
            j = i
            while j < len(messages) and messages[j].get("role") == "tool":
                j += 1
            pieces += tool_turn_pieces([str(x.get("content", "")) for x in messages[i:j]])
            i = j
            continue
        if role == "assistant":
            pieces += [
                generation_prompt(),
                Piece(assistant_body(m), True),
                Piece(IM_END, True),
                Piece("\n", False),
            ]
        elif role in ("system", "user"):
            if role == "system" and i != 0:
                raise ValueError(f"message {i}: a system message is only allowed first")
            pieces.append(Piece(f"{IM_START}{role}\n{m.get('content', '')}{IM_END}", False))
            pieces.append(Piece("\n", False))
        else:
            raise ValueError(f"message {i}: unknown role {role!r}; expected system, user, assistant or tool")
        i += 1
    if add_generation_prompt:
        pieces.append(generation_prompt())
    return pieces


def with_system(messages: Sequence[dict[str, Any]], system_prompt: str | None) -> list[dict[str, Any]]:
    """Prepend the default system prompt unless the conversation brings its own."""
    if system_prompt and (not messages or messages[0].get("role") != "system"):
        return [{"role": "system", "content": system_prompt}, *messages]
    return list(messages)


def conversation_text(messages: Sequence[dict[str, Any]], *, add_generation_prompt: bool = False) -> str:
    """The rendered text (for tokenizer training and display; token ids always come from the pieces)."""
    return "".join(p.text for p in conversation_pieces(messages, add_generation_prompt=add_generation_prompt))


class ChatRenderer:
    """Encodes pieces with a tokenizer; the single place where chat text becomes token ids."""

    def __init__(self, tokenizer: Any, *, system_prompt: str | None = None) -> None:
        self.tokenizer = tokenizer
        self.system_prompt = system_prompt
        unk = getattr(tokenizer, "unk_token_id", None)
        self.eos_id = tokenizer.convert_tokens_to_ids(IM_END)
        if not isinstance(self.eos_id, int) or self.eos_id == unk:
            raise ValueError(
                f"the tokenizer has no {IM_END} token: tirl's chat format is ChatML (Qwen-style)"
            )
        end = tokenizer.convert_tokens_to_ids(TOOL_CALL_END)
        self.tool_call_end_id = end if isinstance(end, int) and end != unk else None

    @property
    def pad_id(self) -> int:
        """Padding id for collation: the tokenizer's pad token, else the end-of-turn token (masks are explicit)."""
        pad = self.tokenizer.pad_token_id
        return pad if pad is not None else self.eos_id

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False) if text else []

    def encode_pieces(self, pieces: Sequence[Piece]) -> tuple[list[int], list[int]]:
        ids: list[int] = []
        mask: list[int] = []
        for p in pieces:
            t = self.encode(p.text)
            ids += t
            mask += [int(p.trainable)] * len(t)
        return ids, mask

    def with_system(self, messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        return with_system(messages, self.system_prompt)

    def render(self, messages: Sequence[dict[str, Any]]) -> tuple[list[int], list[int]]:
        """ids and loss_mask of a whole conversation (SFT)."""
        return self.encode_pieces(conversation_pieces(self.with_system(messages)))

    def prompt_ids(self, messages: Sequence[dict[str, Any]]) -> list[int]:
        """The prompt a rollout starts from: the conversation plus the assistant generation header."""
        return self.encode_pieces(
            conversation_pieces(self.with_system(messages), add_generation_prompt=True)
        )[0]

    def tool_response_ids(self, contents: Sequence[str], *, assistant_closed: bool) -> list[int]:
        """Tokens appended after an assistant turn that called a tool, up to the next generation header.

        If the turn stopped at `</tool_call>` (not at `<|im_end|>`), the closing `<|im_end|>` is added here too.
        """
        pieces = [] if assistant_closed else [Piece(IM_END, False)]
        pieces += [Piece("\n", False), *tool_turn_pieces(contents), generation_prompt()]
        return self.encode_pieces(pieces)[0]
