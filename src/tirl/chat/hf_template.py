"""The `template` chat format: conversations rendered with the tokenizer's own chat template, as pieces.

Any model family whose tokenizer carries a chat template (Llama-, Mistral-, Gemma-, DeepSeek-style, ...) renders
as `apply_chat_template` does, within bounds on the template's work and size (`tirl.chat.bounded_jinja`: a
template from a model directory is code), turn by turn: the piece of a turn is the text that rendering the
conversation up to and including it adds to the rendering up to the turn before (a run of consecutive tool
messages is one turn, as templates group them). An assistant turn's piece is its generation header (what
`add_generation_prompt` adds), its text up to and including the template's end-of-turn token (trainable), and
what the template writes after that token (not trainable). The end-of-turn token is the first special token the
template writes after an assistant's content; it is the id sampling stops at.

A template that re-renders history (strips earlier turns' reasoning, drops a separator at a tool boundary) makes
some rendering not extend the one before it: that is a `HistoryRewrite`, raised with where the texts part.
`tirl.chat.template_check` runs it on a synthetic tool conversation before anything trains or samples. A template
that refuses a conversation (`raise_exception`) or passes a bound is a ValueError with its message shown as one
printable line (escape sequences written out, not sent to the terminal).

Assistant tool calls are written into the turn's content by the run's tool-call format (`chat.tool_format`), so
the parser reads back what the renderer wrote, and the template's tool listing (`tools=`) is used. With
`chat.tool_format: template` (`tool_fmt=None`) the template writes the calls itself from the message's `tool_calls`,
and they are read with the registered format that reads back a probe call as the template writes it
(`tirl.chat.tool_formats.format_of_calls`; none: refused). Deliberately not here: the hand-written formats
(`tirl.chat.template`), token ids.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from tirl.chat.bounded_jinja import render_template
from tirl.chat.pieces import Piece
from tirl.chat.tool_formats import ToolFormat, format_of_calls

SNIPPET_CHARS = 40
MAX_ROLES_SHOWN = 12
MAX_MESSAGE_CHARS = 400  # of what a template raises


class HistoryRewrite(ValueError):
    """Rendering the conversation up to one more turn changed the text of the turns before it."""

    def __init__(self, turn: int, role: str, before: str, after: str) -> None:
        pos = next(
            (i for i, (a, b) in enumerate(zip(before, after, strict=False)) if a != b),
            min(len(before), len(after)),
        )
        self.turn, self.position = turn, pos
        lo = max(0, pos - SNIPPET_CHARS)
        self.snippets = (before[lo : pos + SNIPPET_CHARS], after[lo : pos + SNIPPET_CHARS])
        super().__init__(
            f"the chat template re-renders history: adding message {turn} ({role}) changes the text rendered "
            f"before it at character {pos}\n  before: {self.snippets[0]!r}\n  after : {self.snippets[1]!r}"
        )


def special_tokens(tokenizer: Any) -> list[str]:
    """Every special token of the tokenizer, longest first (so `<|eot_id|>` wins over a prefix of it)."""
    found = set(getattr(tokenizer, "all_special_tokens", []) or [])
    for tok in (getattr(tokenizer, "added_tokens_decoder", None) or {}).values():
        if getattr(tok, "special", False):
            found.add(str(tok.content))
    return sorted(found, key=len, reverse=True)


class TemplateFormat:
    """Renders conversations with `template` (default: the tokenizer's own) as pieces."""

    def __init__(
        self,
        tokenizer: Any,
        tool_fmt: ToolFormat | None,
        *,
        template: str | None = None,
        enable_thinking: bool = True,
        tools: Sequence[dict[str, Any]] = (),
    ) -> None:
        """`tool_fmt` None: the template writes tool calls (`chat.tool_format: template`), read with the format
        found by rendering a probe call (typed by `tools`)."""
        self.tokenizer = tokenizer
        self.template = template or getattr(tokenizer, "chat_template", None)
        if not isinstance(self.template, str) or not self.template:
            raise ValueError(
                "chat.format=template but the tokenizer has no chat template: use a hand-written format "
                "(chatml, qwen2.5, qwen3) or a model directory whose tokenizer carries one"
            )
        self.own_calls = tool_fmt is None
        self.enable_thinking = enable_thinking
        if tool_fmt is not None:
            self.tool_fmt = tool_fmt
        self.eos_text = self._end_of_turn()  # renders no call: needs no tool-call format
        if tool_fmt is None:
            self.tool_fmt = format_of_calls(self.assistant_text, tools)

    def _message(self, m: dict[str, Any]) -> dict[str, Any]:
        if m.get("role") != "assistant":
            return {"role": m.get("role"), "content": str(m.get("content") or "")}
        if self.own_calls:
            out = {"role": "assistant", "content": str(m.get("content") or "")}
            if m.get("tool_calls"):
                out["tool_calls"] = [_openai_call(c) for c in m["tool_calls"]]
        else:
            out = {"role": "assistant", "content": self.tool_fmt.assistant_text(m)}
        if isinstance(m.get("reasoning_content"), str):
            out["reasoning_content"] = m["reasoning_content"]
        return out

    def render(
        self,
        messages: Sequence[dict[str, Any]],
        *,
        tools: Sequence[dict[str, Any]] | None = None,
        add_generation_prompt: bool = False,
    ) -> str:
        """The template's text of `messages`; a template that refuses them raises naming the chat format."""
        try:
            return render_template(
                self.template,
                [self._message(m) for m in messages],
                tools=tools,
                add_generation_prompt=add_generation_prompt,
                enable_thinking=self.enable_thinking,
                **(getattr(self.tokenizer, "special_tokens_map", None) or {}),
            )
        except Exception as e:  # raise_exception, template errors, bounds: the template's own message
            roles = ", ".join(printable(str(m.get("role")), 20) for m in messages[:MAX_ROLES_SHOWN])
            more = f", ... {len(messages) - MAX_ROLES_SHOWN} more" if len(messages) > MAX_ROLES_SHOWN else ""
            raise ValueError(
                f"chat.format=template: the model's chat template cannot render a conversation of roles "
                f"[{roles}{more}] ({type(e).__name__}: {printable(str(e), MAX_MESSAGE_CHARS)})"
            ) from e

    def _end_of_turn(self) -> str:
        """The first special token the template writes after an assistant's content."""
        user, body = {"role": "user", "content": "Hi."}, "Hello there."
        head = self.render([user], add_generation_prompt=True)
        text = self.render([user, {"role": "assistant", "content": body}])
        at = text.find(body, len(head) if text.startswith(head) else 0)
        after = text[at + len(body) :] if at >= 0 else ""
        hits = [(after.find(t), t) for t in special_tokens(self.tokenizer) if t in after]
        if at < 0 or not hits:
            raise ValueError(
                "chat.format=template: the chat template writes no special token after an assistant turn "
                f"(after {body!r} it writes {after[:40]!r}); tirl needs an end-of-turn token to stop sampling at"
            )
        return min(hits, key=lambda h: h[0])[1]  # earliest; the longest at a tie (sorted longest first)

    def assistant_text(self, m: dict[str, Any]) -> str:
        """The text an assistant message generates, without the end-of-turn token: written by the tool-call format,
        or (the template's own calls) the template's text of the turn after a one-question conversation."""
        if not self.own_calls:
            return self.tool_fmt.assistant_text(m)
        user = {"role": "user", "content": "Hi."}
        head = self.render([user], add_generation_prompt=True)
        text = self.render([user, m])
        if not text.startswith(head):
            raise HistoryRewrite(1, "assistant", head, text)
        return self.split_turn(text[len(head) :])[0].text.removesuffix(self.eos_text)

    def pieces(
        self,
        messages: Sequence[dict[str, Any]],
        *,
        tools: Sequence[dict[str, Any]] | None = None,
        add_generation_prompt: bool = False,
    ) -> list[Piece]:
        """The pieces of `messages`: each turn the text it adds to the rendering before it; raises
        `HistoryRewrite` where a rendering does not extend the one before."""
        pieces: list[Piece] = []
        prev, i = "", 0
        while i < len(messages):
            role = str(messages[i].get("role"))
            j = i + 1
            while role == "tool" and j < len(messages) and messages[j].get("role") == "tool":
                j += 1
            if role == "assistant":
                prev = self._extend(pieces, prev, messages[:i], tools, i, role)
            cur = self.render(messages[:j], tools=tools)
            if not cur.startswith(prev):
                raise HistoryRewrite(i, role, prev, cur)
            pieces += (
                self.split_turn(cur[len(prev) :]) if role == "assistant" else [Piece(cur[len(prev) :], False)]
            )
            prev, i = cur, j
        if add_generation_prompt:
            self._extend(pieces, prev, messages, tools, len(messages), "assistant")
        return [p for p in pieces if p.text]

    def _extend(
        self,
        pieces: list[Piece],
        prev: str,
        messages: Sequence[dict[str, Any]],
        tools: Sequence[dict[str, Any]] | None,
        turn: int,
        role: str,
    ) -> str:
        """Append the generation header after `messages` (what `add_generation_prompt` adds to `prev`)."""
        head = self.render(messages, tools=tools, add_generation_prompt=True)
        if not head.startswith(prev):
            raise HistoryRewrite(turn, role, prev, head)
        pieces.append(Piece(head[len(prev) :], False))
        return head

    def split_turn(self, text: str) -> list[Piece]:
        """An assistant turn's text after its header: trainable up to and including the end-of-turn token."""
        end = text.find(self.eos_text)
        if end < 0:
            raise ValueError(
                f"chat.format=template: an assistant turn is rendered without the end-of-turn token "
                f"{self.eos_text!r}: {text[:80]!r}"
            )
        end += len(self.eos_text)
        return [Piece(text[:end], True), Piece(text[end:], False)]

    def tool_pieces(
        self, contents: Sequence[str], *, tools: Sequence[dict[str, Any]] | None = None
    ) -> list[Piece]:
        """What follows a sampled assistant turn's end-of-turn token up to the next generation header: the
        template's tail of the turn, the tool turn of `contents`, the header (rendered after a stand-in turn)."""
        conv = [{"role": "user", "content": "Hi."}, {"role": "assistant", "content": "Let me check."}]
        conv += [{"role": "tool", "content": c} for c in contents]
        pieces = self.pieces(conv, tools=tools, add_generation_prompt=True)
        last = max(k for k, p in enumerate(pieces) if p.trainable)
        return pieces[last + 1 :]


def printable(text: str, limit: int) -> str:
    """`text` as one line of at most `limit` characters, every character that is not printable (a terminal's
    escape sequences, newlines, direction overrides) written as its Python escape: what a template raises is
    shown, never obeyed by the terminal."""
    out = "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text[: limit + 1])
    return out if len(out) <= limit else out[: limit - 3] + "..."


def _openai_call(call: dict[str, Any]) -> dict[str, Any]:
    """A tool call in the OpenAI form templates read (`function.name`, `function.arguments` as a mapping)."""
    fn = call.get("function", call)
    args = fn.get("arguments") or {}
    args = json.loads(args) if isinstance(args, str) else args
    return {"type": "function", "function": {"name": fn["name"], "arguments": args}}
