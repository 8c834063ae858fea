"""Chat rendering with tool calls (`chat.tool_format`), token by token, so that rollouts never re-tokenize their history.

A conversation is rendered as a list of text pieces, each encoded on its own and tagged trainable or not. The agent
loop builds its tool-response tokens from the same piece functions, so the ids of a conversation rendered turn by
turn equal the ids of the whole conversation rendered at once (prefix-preserving), and `loss_mask` is explicit:
1 on assistant content and its closing `<|im_end|>`, 0 on headers, system, user and tool turns.

Formats (`chat.format`), all ChatML with tool results as `<tool_response>` inside a user turn:
  - "chatml": the tiny models' layout, no tool block (their vocabulary is trained on this; the Jinja version
    below is stored with the tiny tokenizer so `apply_chat_template` renders the same text);
  - "qwen2.5": Qwen2.5-Instruct's template: the "# Tools" system block listing the function schemas, and
    Qwen's default system line when the conversation has no system message;
  - "qwen3": Qwen3's template: the same tool block without a default system line, and `<think>` handling.
    Departures from Qwen3's Jinja, both for token-in/token-out training: an assistant turn is rendered as the
    text the model generated (its own `<think>...</think>` included; a `reasoning_content` field is rendered as
    `<think>\n...\n</think>\n\n` before the content), never with earlier turns' reasoning stripped; and with
    `enable_thinking=False` every assistant header carries the empty think block the model was prompted with,
    not only the last one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tirl.chat.bounded_jinja import render_template
from tirl.chat.hf_template import TemplateFormat
from tirl.chat.per_turn import HISTORY, cut_turns, one_stream_refusal, template_turns
from tirl.chat.pieces import Piece, encode_piece
from tirl.chat.template_check import checked_template, synthetic_conversation
from tirl.chat.tool_formats import TEMPLATE, ToolCall, ToolFormat
from tirl.chat.tool_formats import tool_format as tool_format_named
from tirl.chat.tool_formats.hermes import FORMAT as HERMES

IM_START, IM_END = "<|im_start|>", "<|im_end|>"
HAND_FORMATS = ("chatml", "qwen2.5", "qwen3")  # written out here, exact by construction
FORMATS = (*HAND_FORMATS, "template", "auto")  # template: the tokenizer's own (tirl.chat.hf_template)
QWEN25_DEFAULT_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
EMPTY_THINK = "<think>\n\n</think>\n\n"

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


def format_mismatch(fmt: str, *, model_type: str = "", chat_template: str | None = None) -> str | None:
    """Why chat.format `fmt` likely does not match the model's own template, or None. A model prompted in another
    format answers badly and scores near 0, which looks like a bad model rather than a bad setting.

    The template decides when there is one (Qwen's list the tools in `<tools>`; plain ChatML ones do not), else
    the model type (a config.json alone, as `tirl plan` has). `template` and `auto` follow the model's template."""
    if fmt not in HAND_FORMATS:
        return None
    qwen = "<tools>" in chat_template if chat_template else model_type.startswith("qwen")
    seen = "its chat template" if chat_template else f"a {model_type} model"
    if qwen and fmt == "chatml":
        return f"chat.format=chatml but {seen} is Qwen's: the Qwen formats (qwen2.5, qwen3) match it"
    if (chat_template or model_type) and not qwen and fmt != "chatml":
        return (
            f"chat.format={fmt} but {seen} is not Qwen's (no <tools> section): a ChatML model (SmolLM2 and most "
            "non-Qwen models) needs chat.format=chatml"
        )
    return None


def assistant_body(message: dict[str, Any], tool_fmt: ToolFormat = HERMES) -> str:
    """The text an assistant turn generates: its content, then each tool call as `tool_fmt` writes it."""
    return tool_fmt.assistant_text(message)


def tool_turn_pieces(contents: Sequence[str]) -> list[Piece]:
    """One user turn carrying consecutive tool results (never trained on); each result is a verbatim span, so a
    special token's text in it is text (`tirl.chat.pieces`)."""
    text, spans = IM_START + "user", []
    for c in contents:
        text += "\n<tool_response>\n"
        spans.append((len(text), len(text) + len(c)))
        text += f"{c}\n</tool_response>"
    return [Piece(text + IM_END, False, tuple(spans)), Piece("\n", False)]


def generation_prompt(fmt: str = "chatml", *, enable_thinking: bool = True) -> Piece:
    """The assistant header a turn is generated from (Qwen3 without thinking: with an empty think block)."""
    think = EMPTY_THINK if fmt == "qwen3" and not enable_thinking else ""
    return Piece(f"{IM_START}assistant\n{think}", False)


def system_text(
    fmt: str, system: str | None, tools: Sequence[dict[str, Any]] | None, tool_fmt: ToolFormat = HERMES
) -> str | None:
    """The system turn's content in format `fmt`, the tools listed as `tool_fmt` does (None: no system turn)."""
    if fmt == "chatml":
        return system
    if fmt == "qwen2.5" and system is None:
        system = QWEN25_DEFAULT_SYSTEM
    if not tools:
        return system
    return (system + "\n\n" if system is not None else "") + tool_fmt.tools_block(tools)


def assistant_text(message: dict[str, Any], fmt: str, tool_fmt: ToolFormat = HERMES) -> str:
    body = assistant_body(message, tool_fmt)
    reasoning = message.get("reasoning_content")
    if fmt == "qwen3" and isinstance(reasoning, str):
        body = f"<think>\n{reasoning.strip(chr(10))}\n</think>\n\n" + body.lstrip("\n")
    return body


def conversation_pieces(
    messages: Sequence[dict[str, Any]],
    *,
    add_generation_prompt: bool = False,
    fmt: str = "chatml",
    tools: Sequence[dict[str, Any]] | None = None,
    enable_thinking: bool = True,
    tool_fmt: ToolFormat = HERMES,
) -> list[Piece]:
    """The pieces of a whole conversation; validates roles so that a malformed row fails loudly."""
    if fmt not in HAND_FORMATS:
        raise ValueError(f"unknown hand-written chat format {fmt!r}; valid: {', '.join(HAND_FORMATS)}")
    header = generation_prompt(fmt, enable_thinking=enable_thinking)
    has_system = bool(messages) and messages[0].get("role") == "system"
    system = system_text(fmt, str(messages[0].get("content", "")) if has_system else None, tools, tool_fmt)
    pieces: list[Piece] = []
    if system is not None:
        pieces += [Piece(f"{IM_START}system\n{system}{IM_END}", False), Piece("\n", False)]
    i = 1 if has_system else 0
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
                header,
                Piece(assistant_text(m, fmt, tool_fmt), True),
                Piece(IM_END, True),
                Piece("\n", False),
            ]
        elif role == "user":
            pieces.append(Piece(f"{IM_START}{role}\n{m.get('content', '')}{IM_END}", False))
            pieces.append(Piece("\n", False))
        elif role == "system":
            raise ValueError(f"message {i}: a system message is only allowed first")
        else:
            raise ValueError(f"message {i}: unknown role {role!r}; expected system, user, assistant or tool")
        i += 1
    if add_generation_prompt:
        pieces.append(header)
    return pieces


def with_system(messages: Sequence[dict[str, Any]], system_prompt: str | None) -> list[dict[str, Any]]:
    """Prepend the default system prompt unless the conversation brings its own."""
    if system_prompt and (not messages or messages[0].get("role") != "system"):
        return [{"role": "system", "content": system_prompt}, *messages]
    return list(messages)


def conversation_text(
    messages: Sequence[dict[str, Any]],
    *,
    add_generation_prompt: bool = False,
    fmt: str = "chatml",
    tool_fmt: ToolFormat = HERMES,
) -> str:
    """The rendered text (for tokenizer training and display; token ids always come from the pieces)."""
    pieces = conversation_pieces(
        messages, add_generation_prompt=add_generation_prompt, fmt=fmt, tool_fmt=tool_fmt
    )
    return "".join(p.text for p in pieces)


def _renders_as(tokenizer: Any, fmt: str, tools: list[dict[str, Any]], tool_fmt: ToolFormat) -> bool:
    """Whether the tokenizer's template writes the synthetic conversation (with and without a system turn, and a
    prompt's generation header) as hand-written format `fmt` does."""
    conv = synthetic_conversation(tools)
    for msgs, gen in ((conv, False), (conv[1:], False), (conv[1:2], True)):
        ours = conversation_pieces(msgs, add_generation_prompt=gen, fmt=fmt, tools=tools, tool_fmt=tool_fmt)
        try:
            theirs = render_template(  # bounded: the template is the model directory's code
                tokenizer.chat_template, msgs, tools=tools or None, add_generation_prompt=gen,
                **(getattr(tokenizer, "special_tokens_map", None) or {}),
            )  # fmt: skip
        except Exception:  # a template that cannot render it is not this format
            return False
        if theirs != "".join(p.text for p in ours):
            return False
    return True


def auto_format(tokenizer: Any, tools: list[dict[str, Any]], tool_fmt: ToolFormat) -> str:
    """`chat.format: auto`: the hand-written format the model's template writes (chatml and qwen2.5 compared
    text for text; qwen3 by its markers, as Qwen3's template strips earlier reasoning where tirl keeps the text
    sampled), else `template`; `chatml` for a tokenizer without a template."""
    template = getattr(tokenizer, "chat_template", None)
    if not isinstance(template, str) or not template:
        return "chatml"
    for fmt in ("chatml", "qwen2.5"):
        if _renders_as(tokenizer, fmt, tools, tool_fmt):
            return fmt
    if all(marker in template for marker in (IM_START, "<tools>", "<think>")):
        return "qwen3"
    return "template"


class ChatRenderer:
    """Encodes pieces with a tokenizer; the single place where chat text becomes token ids.

    `tools` are the function schemas put in the system turn (Qwen formats; default: none, the caller passes its
    task's, `ToolSet.schemas`); a row's own `tools` (SFT files) override them per call. `tool_format` names how
    calls are written and read (`chat.tool_format`, `tirl.chat.tool_formats`; `template`: the chat template writes
    them, `chat.format` template or auto). `history` is `chat.history`: `per_turn` makes SFT's `samples` one per
    assistant turn (`tirl.chat.per_turn`) and, where the template re-renders history (`divergence`), refuses the
    token streams sampling builds.
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        system_prompt: str | None = None,
        fmt: str = "chatml",
        tools: Sequence[dict[str, Any]] | None = None,
        enable_thinking: bool = True,
        tool_format: str = "hermes",
        history: str = "exact",
    ) -> None:
        if fmt not in FORMATS:
            raise ValueError(f"unknown chat format {fmt!r}; valid: {', '.join(FORMATS)}")
        if history not in HISTORY:
            raise ValueError(f"unknown chat.history {history!r}; valid: {', '.join(HISTORY)}")
        self.tokenizer = tokenizer
        self.system_prompt = system_prompt
        self.tools = list(tools) if tools is not None else []
        self.enable_thinking = enable_thinking
        own_calls = tool_format == TEMPLATE  # the template writes them: no hand-written format can
        self.tool_format = HERMES if own_calls else tool_format_named(tool_format)
        if fmt == "auto":
            fmt = "template" if own_calls else auto_format(tokenizer, self.tools, self.tool_format)
        self.fmt = fmt
        if own_calls and self.fmt != "template":
            raise ValueError(f"chat.tool_format=template needs chat.format=template or auto, not {fmt}")
        self.history = history
        self.template: TemplateFormat | None = None
        self.divergence: str | None = None  # per_turn: why the template gives no single token stream
        if self.fmt == "template":  # checked before anything trains or samples (tirl.chat.template_check)
            self.template, self.divergence = checked_template(
                tokenizer, None if own_calls else self.tool_format, self.tools,
                enable_thinking=enable_thinking, history=history,
            )  # fmt: skip
            self.tool_format = self.template.tool_fmt
        self.eos_text = self.template.eos_text if self.template else IM_END  # a sampled turn's closing token
        unk = getattr(tokenizer, "unk_token_id", None)
        self.eos_id = tokenizer.convert_tokens_to_ids(self.eos_text)
        if not isinstance(self.eos_id, int) or self.eos_id == unk:
            raise ValueError(
                f"the tokenizer has no {IM_END} token: the hand-written chat formats are ChatML (Qwen-style); "
                "chat.format=template renders with the model's own chat template"
            )
        end = tokenizer.convert_tokens_to_ids(self.tool_format.end) if self.tool_format.end else None
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
            t = encode_piece(self.tokenizer, p)
            ids += t
            mask += [int(p.trainable)] * len(t)
        return ids, mask

    def with_system(self, messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        return with_system(messages, self.system_prompt)

    def pieces(
        self,
        messages: Sequence[dict[str, Any]],
        *,
        add_generation_prompt: bool = False,
        tools: Sequence[dict[str, Any]] | None = None,
    ) -> list[Piece]:
        if self.template is not None:
            return self.template.pieces(
                self.with_system(messages),
                tools=self.tools if tools is None else tools,
                add_generation_prompt=add_generation_prompt,
            )
        return conversation_pieces(
            self.with_system(messages),
            add_generation_prompt=add_generation_prompt,
            fmt=self.fmt,
            tools=self.tools if tools is None else tools,
            enable_thinking=self.enable_thinking,
            tool_fmt=self.tool_format,
        )

    def parse_calls(
        self, text: str, schemas: Sequence[dict[str, Any]] | None = None, limit: int | None = None
    ) -> list[ToolCall]:
        """The calls of an assistant turn, read as `tool_format` writes them, typed by `schemas` (default: the
        tools the renderer lists)."""
        return self.tool_format.parse(text, self.tools if schemas is None else schemas, limit)

    def assistant_body(self, message: dict[str, Any]) -> str:
        """The text an assistant message generates, calls written in this renderer's tool format (or, with the
        template's own calls, as the template writes them)."""
        if self.template is not None:
            return self.template.assistant_text(message)
        return assistant_body(message, self.tool_format)

    def render(
        self, messages: Sequence[dict[str, Any]], *, tools: Sequence[dict[str, Any]] | None = None
    ) -> tuple[list[int], list[int]]:
        """ids and loss_mask of a whole conversation (SFT)."""
        return self.encode_pieces(self.pieces(messages, tools=tools))

    def samples(
        self, messages: Sequence[dict[str, Any]], *, tools: Sequence[dict[str, Any]] | None = None
    ) -> list[tuple[list[int], list[int]]]:
        """SFT's (ids, loss_mask) samples of a conversation: the whole of it (chat.history=exact), or one per
        assistant turn (per_turn, `tirl.chat.per_turn`): prompted with the template's own text where it re-renders
        history, else with the stream sampling builds."""
        if self.history != "per_turn":
            return [self.render(messages, tools=tools)]
        msgs, tools = self.with_system(messages), self.tools if tools is None else tools
        if self.template is not None and self.divergence is not None:
            return [self.encode_pieces(p) for p in template_turns(self.template, msgs, tools)]
        turns = cut_turns(msgs, lambda m: self.pieces(m, tools=tools))
        return [self.encode_pieces(p) for p in turns]

    def require_one_stream(self, what: str) -> None:
        """Refuse `what` (a sampler: RL, evaluation) when chat.history=per_turn covers a template that gives no
        single token stream."""
        if self.divergence is not None:
            raise ValueError(one_stream_refusal(what, self.divergence))

    def text(self, messages: Sequence[dict[str, Any]], *, add_generation_prompt: bool = False) -> str:
        return "".join(p.text for p in self.pieces(messages, add_generation_prompt=add_generation_prompt))

    def prompt_ids(self, messages: Sequence[dict[str, Any]]) -> list[int]:
        """The prompt a rollout starts from: the conversation plus the assistant generation header."""
        self.require_one_stream("sampling")
        return self.encode_pieces(self.pieces(messages, add_generation_prompt=True))[0]

    def tool_response_ids(
        self, contents: Sequence[str], *, assistant_closed: bool, newline: bool = True
    ) -> list[int]:
        """Tokens appended after an assistant turn that called a tool, up to the next generation header.

        If the turn stopped at `</tool_call>` (not at `<|im_end|>`), the closing `<|im_end|>` is added here too.
        `newline=False` joins the tool turn as verl's agent loop does: `<|im_end|><|im_start|>user`, no newline
        (it renders the tool message alone and strips the template's prefix, which takes the newline with it).
        """
        self.require_one_stream("the agent loop")
        pieces = [] if assistant_closed else [Piece(self.eos_text, False)]
        if self.template is not None:
            if not newline:
                raise ValueError(
                    "agent.token_stream=verl is a ChatML stream; chat.format=template follows the model's template"
                )
            return self.encode_pieces(pieces + self.template.tool_pieces(contents, tools=self.tools))[0]
        header = generation_prompt(self.fmt, enable_thinking=self.enable_thinking)
        pieces += [*([Piece("\n", False)] if newline else []), *tool_turn_pieces(contents), header]
        return self.encode_pieces(pieces)[0]
